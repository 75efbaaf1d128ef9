"""nomic-bert (nomic-embed-text) on the torch encoder against transformers' native NomicBertModel on a
tiny random model: the folder as transformers saves it, and the same weights in nomic's own layout
(fused Wqkv, fc11/fc12/fc2, norm1/2, n_embd-style config.json) as the published checkpoints are."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.backends.torch.encoders import load_encoder
from localchat.embeddings.text import Encoded

transformers = pytest.importorskip("transformers")

INPUTS = [[2, 17, 33, 45, 9, 3], [2, 60, 3], [2, 5, 6, 7, 8, 9, 10, 11, 12, 3]]
MODULES = [
    {"idx": "0", "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": "1", "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": "2", "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def _model(vocab_size: int = 99) -> torch.nn.Module:
    torch.manual_seed(7)
    config = transformers.NomicBertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )  # fmt: skip
    model = transformers.NomicBertModel(config).eval()
    with torch.no_grad():  # random LayerNorms are identity; make them matter (and the token types)
        for name, p in model.named_parameters():
            if "layernorm" in name.lower() or "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def _sentence_files(folder: Path) -> None:
    (folder / "modules.json").write_text(json.dumps(MODULES))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))


def _nomic_layout(model: torch.nn.Module, folder: Path) -> Path:
    """The same weights under nomic's remote-code names and config keys."""
    from safetensors.torch import save_file

    folder.mkdir()
    out: dict[str, torch.Tensor] = {}
    sd = model.state_dict()
    for name, t in sd.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            stem = name.replace("self_attn.q_proj.weight", "")
            qkv = [sd[f"{stem}self_attn.{p}_proj.weight"] for p in "qkv"]
            out["encoder." + stem + "attn.Wqkv.weight"] = torch.cat(qkv, 0)
            continue
        new = name.replace("embeddings.LayerNorm.", "emb_ln.")
        for a, b in (("self_attn.o_proj", "attn.out_proj"), ("mlp.up_proj", "mlp.fc11"),
                     ("mlp.gate_proj", "mlp.fc12"), ("mlp.down_proj", "mlp.fc2"),
                     ("post_attention_layernorm", "norm1"), ("post_mlp_layernorm", "norm2")):  # fmt: skip
            new = new.replace(a, b)
        if new.startswith("layers."):
            new = "encoder." + new
        out[new] = t.contiguous()
    save_file(out, str(folder / "model.safetensors"))
    c = model.config
    config = {
        "model_type": "nomic_bert", "architectures": ["NomicBertModel"], "n_embd": c.hidden_size,
        "n_head": c.num_attention_heads, "n_layer": c.num_hidden_layers, "n_inner": c.intermediate_size,
        "n_positions": 64, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "activation_function": "swiglu", "layer_norm_epsilon": c.layer_norm_eps, "prenorm": False,
        "type_vocab_size": 2, "vocab_size": c.vocab_size, "qkv_proj_bias": False, "mlp_fc1_bias": False,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("layout", ["transformers", "nomic"])
def test_nomic_bert_matches_transformers(tmp_path: Path, layout: str) -> None:
    model = _model()
    if layout == "transformers":
        folder = tmp_path / "native"
        model.save_pretrained(folder, safe_serialization=True)
    else:
        folder = _nomic_layout(model, tmp_path / "nomic")
    _sentence_files(folder)
    encoder, sentence = load_encoder(folder)
    assert sentence.pooling == "mean" and sentence.normalize
    width = max(len(i) for i in INPUTS)
    ids = torch.tensor([i + [0] * (width - len(i)) for i in INPUTS])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in INPUTS])
    types = torch.zeros_like(ids)
    types[2, 5:] = 1  # a second segment in one input
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    batch = [Encoded(list(i), types[r, : len(i)].tolist()) for r, i in enumerate(INPUTS)]
    ours_ids, ours_types, ours_mask = encoder.batch_tensors(batch)  # type: ignore[attr-defined]
    hidden = encoder.hidden_states(ours_ids, ours_types, ours_mask)  # type: ignore[attr-defined]
    for row, inp in enumerate(INPUTS):
        torch.testing.assert_close(hidden[row, : len(inp)], ref[row, : len(inp)], atol=2e-5, rtol=1e-4)
    m = mask.unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((ref * m).sum(1) / m.sum(1), dim=-1).numpy()
    ours = encoder.embed(batch)
    np.testing.assert_allclose(ours, expected, atol=2e-5)
    np.testing.assert_allclose(encoder.embed(batch[1:2])[0], ours[1], atol=2e-6)  # alone == in a batch


def test_nomic_bert_refuses_partial_rotary(tmp_path: Path) -> None:
    folder = _nomic_layout(_model(), tmp_path / "nomic")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rotary_emb_fraction": 0.5}))
    from localchat.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="partial rotary"):
        load_encoder(folder)
