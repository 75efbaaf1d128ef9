"""`localchat pull` for the catalog's embedding and rerank entries, against the fake hub: the
sentence-transformers files come along (modules.json, 1_Pooling/, vocab) and the ONNX/OpenVINO copies
do not, and the pulled folder loads as the embedding model with the catalog entry's pooling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localchat import hub
from localchat.models import catalog
from tests.helpers.fake_hub import FakeHub

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _tiny_minilm_files(tmp: Path) -> dict[str, bytes | Path]:
    """A tiny random BERT in the all-MiniLM-L6-v2 repo layout (mean pooling + Normalize)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64)  # fmt: skip
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(tmp, safe_serialization=True)
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "cat", "dog", "sleeps"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tok.save(str(tmp / "tokenizer.json"))
    modules = [
        {"idx": "0", "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": "1", "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": "2", "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    return {
        "config.json": tmp / "config.json",
        "model.safetensors": tmp / "model.safetensors",
        "tokenizer.json": tmp / "tokenizer.json",
        "vocab.txt": "\n".join(vocab).encode(),
        "modules.json": json.dumps(modules).encode(),
        "sentence_bert_config.json": b'{"max_seq_length": 32}',
        "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
        "onnx/model.onnx": b"x" * 5000,
        "openvino/openvino_model.bin": b"y" * 5000,
        "README.md": b"# all-MiniLM-L6-v2\n",
    }


def test_embedding_entries_are_typed() -> None:
    entries = catalog.load_catalog()
    assert entries["all-minilm-l6-v2"].type == "embedding"
    assert entries["bge-reranker-v2-m3"].type == "rerank"
    assert entries["smollm2-135m"].type == "chat"
    assert entries["nomic-embed-text-v1.5-gguf"].format == "gguf"


def test_pull_an_embedding_entry_and_load_it(fake_hub: FakeHub, tmp_path: Path) -> None:
    from localchat.embeddings.model import load_side_models

    files = _tiny_minilm_files(tmp_path / "src")
    fake_hub.add_repo("sentence-transformers/all-MiniLM-L6-v2", files)
    local = hub.pull("all-minilm-l6-v2")
    folder = local.path if local.path.is_dir() else local.path.parent
    pulled = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert {"modules.json", "1_Pooling/config.json", "vocab.txt", "model.safetensors"} <= pulled
    assert not any(p.startswith(("onnx/", "openvino/")) for p in pulled)
    (model,) = load_side_models("all-minilm-l6-v2", None)
    assert model.kind == "embedding" and model.sentence.pooling == "mean" and model.sentence.normalize
    vector = model.encoder.embed([model.encode_text("a cat sleeps")])
    assert vector.shape == (1, 16) and np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)


def test_list_marks_embedding_and_rerank_models() -> None:
    from localchat.cli.models import format_table
    from localchat.hub import LocalModel

    rows = format_table([
        LocalModel("smollm2-135m", None, "Q4_1", "gguf", Path("/m/SmolLM2-135M-Instruct.Q4_1.gguf")),
        LocalModel("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2", None, "safetensors", Path("/m/a")),
        LocalModel("bge-reranker-v2-m3", "BAAI/bge-reranker-v2-m3", None, "safetensors", Path("/m/b")),
    ]).splitlines()  # fmt: skip
    assert rows[1].endswith("complete")
    assert rows[2].endswith("complete (embedding)") and rows[3].endswith("complete (rerank)")
