"""The torch encoders against transformers on tiny random models (fp32): hidden states and pooled,
normalised sentence vectors for BERT and XLM-RoBERTa, and the cross-encoder scores of their
sequence-classification heads. Inputs of different lengths share a batch, so padding must be masked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.torch.encoders import load_encoder
from localchat.embeddings.text import Encoded

transformers = pytest.importorskip("transformers")

INPUTS = [[2, 17, 33, 45, 9, 3], [2, 60, 3], [2, 5, 6, 7, 8, 9, 10, 11, 12, 3]]


def _config(kind: str, **extra: object) -> object:
    common = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        **extra,
    )
    if kind == "bert":
        return transformers.BertConfig(**common)
    return transformers.XLMRobertaConfig(pad_token_id=1, **common)


def _save(model: Any, folder: Path, modules: list[dict[str, str]] | None, pooling: str) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    if modules is not None:
        (folder / "modules.json").write_text(json.dumps(modules))
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps({f"pooling_mode_{pooling}": True, "word_embedding_dimension": 32})
        )
    return folder


ST_MODULES = [
    {"idx": "0", "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": "1", "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": "2", "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def _reference(model: torch.nn.Module, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(i) for i in INPUTS)
    ids = torch.tensor([i + [pad] * (width - len(i)) for i in INPUTS])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in INPUTS])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits, mask


def _batch() -> list[Encoded]:
    return [Encoded(list(i), [0] * len(i)) for i in INPUTS]


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
@pytest.mark.parametrize("pooling", ["mean_tokens", "cls_token", "lasttoken"])
def test_hidden_states_and_sentence_vectors_match_transformers(
    tmp_path: Path, kind: str, pooling: str
) -> None:
    torch.manual_seed(0)
    cls = transformers.BertModel if kind == "bert" else transformers.XLMRobertaModel
    model = cls(_config(kind), add_pooling_layer=False).eval()
    folder = _save(model, tmp_path / kind, ST_MODULES, pooling)
    encoder, sentence = load_encoder(folder)
    assert sentence.normalize and not encoder.is_reranker
    ref, mask = _reference(model, pad=0 if kind == "bert" else 1)
    ids, types, ours_mask = encoder.batch_tensors(_batch())  # type: ignore[attr-defined]
    hidden = encoder.hidden_states(ids, types, ours_mask)  # type: ignore[attr-defined]
    for row, inp in enumerate(INPUTS):  # padded positions are not compared (both leave them unused)
        n = len(inp)
        torch.testing.assert_close(hidden[row, :n], ref[row, :n], atol=2e-5, rtol=1e-4)
    # sentence-transformers' pooling computed on transformers' states
    m = mask.unsqueeze(-1).float()
    pooled = {
        "mean_tokens": (ref * m).sum(1) / m.sum(1),
        "cls_token": ref[:, 0],
        "lasttoken": ref[torch.arange(len(INPUTS)), mask.sum(1) - 1],
    }[pooling]
    expected = torch.nn.functional.normalize(pooled, dim=-1).numpy()
    ours = encoder.embed(_batch())
    np.testing.assert_allclose(ours, expected, atol=2e-5)
    # one input alone gives the same vector as inside the padded batch
    np.testing.assert_allclose(encoder.embed(_batch()[1:2])[0], ours[1], atol=2e-6)


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
def test_cross_encoder_scores_match_transformers(tmp_path: Path, kind: str) -> None:
    torch.manual_seed(1)
    cls = (
        transformers.BertForSequenceClassification
        if kind == "bert"
        else transformers.XLMRobertaForSequenceClassification
    )
    model = cls(_config(kind, num_labels=1)).eval()
    folder = _save(model, tmp_path / kind, None, "")
    encoder, _ = load_encoder(folder)
    assert encoder.is_reranker
    logits, _ = _reference(model, pad=0 if kind == "bert" else 1)
    expected = torch.sigmoid(logits).numpy()
    batch = [Encoded(list(i), [0] * len(i)) for i in INPUTS]
    np.testing.assert_allclose(encoder.score(batch), expected, atol=2e-5)


def test_token_types_reach_the_cross_encoder(tmp_path: Path) -> None:
    """A (query, document) pair's second segment uses token type 1, as BertForSequenceClassification."""
    torch.manual_seed(2)
    model = transformers.BertForSequenceClassification(_config("bert", num_labels=1)).eval()
    with torch.no_grad():  # random init leaves the type embeddings too small to move a sigmoid visibly
        model.bert.embeddings.token_type_embeddings.weight.mul_(50)
        model.classifier.weight.mul_(100)
    encoder, _ = load_encoder(_save(model, tmp_path / "b", None, ""))
    ids = INPUTS[2]
    types = [0] * 4 + [1] * (len(ids) - 4)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits
    ours = encoder.score([Encoded(ids, types)])
    np.testing.assert_allclose(ours, torch.sigmoid(ref).numpy(), atol=2e-5)
    assert not np.allclose(ours, encoder.score([Encoded(ids, [0] * len(ids))]), atol=1e-4)


def test_modernbert_matches_transformers(tmp_path: Path) -> None:
    """Global and local (sliding-window) layers, rotary thetas per kind, GeGLU; inputs longer than the
    window so the local mask matters."""
    torch.manual_seed(3)
    config = transformers.ModernBertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0,
    )  # fmt: skip
    model = transformers.ModernBertModel(config).eval()
    folder = _save(model, tmp_path / "mb", ST_MODULES, "mean_tokens")
    encoder, _ = load_encoder(folder)
    ref, mask = _reference(model, pad=0)
    ids, types, ours_mask = encoder.batch_tensors(_batch())  # type: ignore[attr-defined]
    hidden = encoder.hidden_states(ids, types, ours_mask)  # type: ignore[attr-defined]
    for row, inp in enumerate(INPUTS):
        torch.testing.assert_close(hidden[row, : len(inp)], ref[row, : len(inp)], atol=2e-5, rtol=1e-4)
    m = mask.unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((ref * m).sum(1) / m.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(encoder.embed(_batch()), expected, atol=2e-5)


@pytest.mark.parametrize("kind", ["qwen3", "qwen2"])
def test_decoder_embedding_model_matches_transformers(tmp_path: Path, kind: str) -> None:
    """Qwen3-Embedding style: a causal decoder, last-token pooled and normalised (GQA, q/k norm)."""
    torch.manual_seed(4)
    common = dict(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=64,
    )  # fmt: skip
    if kind == "qwen3":
        model = transformers.Qwen3Model(transformers.Qwen3Config(head_dim=16, **common)).eval()
    else:
        model = transformers.Qwen2Model(transformers.Qwen2Config(**common)).eval()
    folder = _save(model, tmp_path / kind, ST_MODULES, "lasttoken")
    encoder, sentence = load_encoder(folder)
    assert sentence.pooling == "lasttoken"
    ref, mask = _reference(model, pad=0)
    ids, types, ours_mask = encoder.batch_tensors(_batch())  # type: ignore[attr-defined]
    hidden = encoder.hidden_states(ids, types, ours_mask)  # type: ignore[attr-defined]
    for row, inp in enumerate(INPUTS):
        torch.testing.assert_close(hidden[row, : len(inp)], ref[row, : len(inp)], atol=2e-5, rtol=1e-4)
    last = ref[torch.arange(len(INPUTS)), mask.sum(1) - 1]
    expected = torch.nn.functional.normalize(last, dim=-1).numpy()
    np.testing.assert_allclose(encoder.embed(_batch()), expected, atol=2e-5)


def test_embeddinggemma_encoder_matches_transformers(tmp_path: Path) -> None:
    """Bidirectional Gemma 3 (EmbeddingGemma): local layers see +-window, global layers everything;
    mean pooling, then a Dense layer (the folder's 2_Dense) and normalisation."""
    torch.manual_seed(5)
    config = transformers.Gemma3TextConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=48, max_position_embeddings=64, sliding_window=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        use_bidirectional_attention=True, query_pre_attn_scalar=16, pad_token_id=0,
    )  # fmt: skip
    model = transformers.Gemma3TextModel(config).eval()
    with torch.no_grad():  # random (1 + w) norms start at w = 0: give them something to get wrong
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0, 0.5)
    modules = [*ST_MODULES[:2], {"idx": "2", "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
               {**ST_MODULES[2], "idx": "3"}]  # fmt: skip
    folder = _save(model, tmp_path / "eg", modules, "mean_tokens")
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 32, "out_features": 8, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity"}))  # fmt: skip
    dense = torch.randn(8, 32)
    from safetensors.torch import save_file

    save_file({"linear.weight": dense}, str(folder / "2_Dense" / "model.safetensors"))
    encoder, _ = load_encoder(folder)
    assert encoder.dimension == 8
    ref, mask = _reference(model, pad=0)
    ids, types, ours_mask = encoder.batch_tensors(_batch())  # type: ignore[attr-defined]
    hidden = encoder.hidden_states(ids, types, ours_mask)  # type: ignore[attr-defined]
    for row, inp in enumerate(INPUTS):
        torch.testing.assert_close(hidden[row, : len(inp)], ref[row, : len(inp)], atol=5e-5, rtol=1e-4)
    m = mask.unsqueeze(-1).float()
    expected = torch.nn.functional.normalize(((ref * m).sum(1) / m.sum(1)) @ dense.T, dim=-1).numpy()
    np.testing.assert_allclose(encoder.embed(_batch()), expected, atol=5e-5)


def test_qwen3_reranker_scores_match_transformers(tmp_path: Path) -> None:
    """Qwen3-Reranker style: P(yes) against no from the causal LM's next-token logits at the last token."""
    torch.manual_seed(6)
    config = transformers.Qwen3Config(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=48, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config).eval()
    folder = _save(model, tmp_path / "qr", None, "")
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(99)} | {"yes": 40, "no": 41}
    del vocab["t40"], vocab["t41"]
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))
    encoder, _ = load_encoder(folder, rerank=True)
    assert encoder.is_reranker
    width = max(len(i) for i in INPUTS)
    ids = torch.tensor([i + [0] * (width - len(i)) for i in INPUTS])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in INPUTS])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    last = logits[torch.arange(len(INPUTS)), mask.sum(1) - 1][:, [40, 41]]
    expected = torch.softmax(last, dim=-1)[:, :1].numpy()
    np.testing.assert_allclose(encoder.score(_batch()), expected, atol=2e-5)
    # through the served model: each pair goes into the judging prompt, scored in one batch
    from localchat.embeddings.model import load_embedding_model
    from tests.helpers.run_async import run_async

    served = load_embedding_model(folder, rerank=True)
    scores, tokens = run_async(served.rerank("query", ["doc a", "doc b"]))
    prompt = served.tokenizer.encode(encoder.pair_text("query", "doc a"), special=False)  # type: ignore[attr-defined]
    assert tokens == 2 * len(prompt) and 0 < scores[0] < 1
    np.testing.assert_allclose(scores[0], encoder.score([prompt])[0, 0], atol=1e-6)
