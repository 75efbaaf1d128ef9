"""GGUF encoders against transformers: tiny random BERT and nomic-bert models (with the real
bert-base-uncased WordPiece vocabulary of all-MiniLM-L6-v2, which llama.cpp's converter recognises)
written to GGUF by llama.cpp's own convert_hf_to_gguf.py, then loaded by localchat and compared with
transformers on the same folder, sentence by sentence. The texts are tokenized with the folder's HF
tokenizer (the GGUF's own WordPiece tokenizer is tested with the tokenizers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.backends.torch.encoders.gguf_encoder import load_gguf_encoder
from localchat.embeddings.text import Encoded, EncoderTokenizer
from tests.backends.test_encoders_nomic import _model as tiny_nomic
from tests.backends.test_encoders_nomic import _nomic_layout
from tests.helpers.llama_convert import convert
from tests.helpers.minilm import minilm_folder  # noqa: F401

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # downloads llama-cpp-python's sdist once (76 MB) and runs its converter

TEXTS = ["A man is eating food.", "The cat sleeps", "Rotary positions and SwiGLU, in a GGUF file!"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def _with_tokenizer(folder: Path, minilm: Path, pooling: str) -> None:
    for name in _TOKENIZER_FILES:
        if (minilm / name).is_file():
            shutil.copy(minilm / name, folder / name)
    modules = [
        {"idx": "0", "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": "1", "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{pooling}": True}))


def _expected(model: torch.nn.Module, items: list[Encoded], pooling: str) -> np.ndarray:
    rows = []
    for item in items:  # one at a time: no padding in the reference
        with torch.no_grad():
            h = model(input_ids=torch.tensor([item.ids]), token_type_ids=torch.tensor([item.type_ids]))
        h = h.last_hidden_state[0]
        rows.append(torch.nn.functional.normalize(h.mean(0) if pooling == "mean_tokens" else h[0], dim=-1))
    return torch.stack(rows).numpy()


@pytest.mark.parametrize(("outtype", "pooling"), [("f32", "mean_tokens"), ("f16", "cls_token")])
def test_bert_gguf_matches_transformers(
    tmp_path: Path,
    minilm_folder: Path,  # noqa: F811
    outtype: str,
    pooling: str,
) -> None:
    torch.manual_seed(11)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    folder = tmp_path / "bert"
    model.save_pretrained(folder, safe_serialization=True)
    _with_tokenizer(folder, minilm_folder, pooling)
    gguf_path = convert(folder, tmp_path / f"bert-{outtype}.gguf", outtype)
    encoder, sentence = load_gguf_encoder(gguf_path)
    assert sentence.pooling == ("mean" if pooling == "mean_tokens" else "cls") and sentence.normalize
    items = [EncoderTokenizer(folder, 128).encode(t) for t in TEXTS]
    tolerance = 2e-5 if outtype == "f32" else 2e-3  # f16 weights round the matrices
    np.testing.assert_allclose(encoder.embed(items), _expected(model, items, pooling), atol=tolerance)


def test_nomic_bert_gguf_matches_transformers(tmp_path: Path, minilm_folder: Path) -> None:  # noqa: F811
    model = tiny_nomic(vocab_size=30522)
    folder = _nomic_layout(model, tmp_path / "nomic")
    config = json.loads((folder / "config.json").read_text())
    # the values llama.cpp's converter checks for nomic-embed-text v1.5 (it trained on 2048 tokens)
    config.update(
        n_positions=8192,
        max_trained_positions=2048,
        causal=False,
        rotary_emb_scale_base=None,
        mlp_fc2_bias=False,
    )
    # transformers 5's native NomicBertConfig (which the converter loads) ignores nomic's n_embd-style
    # keys and would report its 768-wide defaults: give it the sizes under its own names too
    c = model.config
    config.update(
        hidden_size=c.hidden_size,
        num_attention_heads=c.num_attention_heads,
        num_hidden_layers=c.num_hidden_layers,
        intermediate_size=c.intermediate_size,
    )
    (folder / "config.json").write_text(json.dumps(config))
    _with_tokenizer(folder, minilm_folder, "mean_tokens")
    gguf_path = convert(folder, tmp_path / "nomic.gguf", "f32")
    encoder, sentence = load_gguf_encoder(gguf_path)
    assert sentence.pooling == "mean" and encoder.max_positions == 2048
    items = [EncoderTokenizer(folder, 128).encode(t) for t in TEXTS]
    np.testing.assert_allclose(encoder.embed(items), _expected(model, items, "mean_tokens"), atol=2e-5)


def test_gguf_embedding_model_with_its_own_wordpiece(tmp_path: Path, minilm_folder: Path) -> None:  # noqa: F811
    """`--embedding-model file.gguf`: the encoder and the GGUF's own WordPiece tokenizer (llama.cpp's
    phantom-space vocabulary read back) give the ids and vectors of the HF folder it came from."""
    pytest.importorskip("localchat.weights.tokenizer_wordpiece", reason="GGUF WordPiece not in this tree")
    from localchat.embeddings.model import load_side_models

    torch.manual_seed(12)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    folder = tmp_path / "bert"
    model.save_pretrained(folder, safe_serialization=True)
    _with_tokenizer(folder, minilm_folder, "mean_tokens")
    gguf_path = convert(folder, tmp_path / "tiny-bert.gguf", "f32")
    (served,) = load_side_models(str(gguf_path), None)
    assert served.model_id == "tiny-bert" and served.kind == "embedding"
    hf = EncoderTokenizer(folder, 128)
    texts = [*TEXTS, "Unbelievably well-tokenized naïve café words"]
    for text in texts:
        assert served.tokenizer.encode(text) == hf.encode(text)
    assert served.tokenizer.encode("query", "a document") == hf.encode("query", "a document")
    items = [served.encode_text(t) for t in texts]
    np.testing.assert_allclose(served.encoder.embed(items), _expected(model, items, "mean_tokens"), atol=2e-5)
