"""The pre-load RAM check sizes a dense (safetensors) model in the format `--isq` gives its weights: GGUF
blocks (Q8_0 34 bytes, Q4_K 144, Q5_0 22, Q4_0 18 per block), torch int4 (5 bits per weight), the token
embedding and LM head at Q8_0 (block types) or dense (q4), norms as stored. The expected sizes below are
worked out by hand from those formats, not from the code under test."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from localchat.errors import InsufficientMemoryError
from localchat.models.catalog import ResolvedModel
from localchat.models.manager import ModelManager
from localchat.models.memory import MIB, check_fits, estimate
from localchat.weights.x16 import x16_active
from tests.helpers.fake_app import fake_settings

HIDDEN, FFN, VOCAB = 576, 1536, 512  # 576 = 18 * 32 (no multiple of 256, like SmolLM2); 1536 = 6 * 256
TENSORS = {
    "model.embed_tokens.weight": (VOCAB, HIDDEN),
    "model.layers.0.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
    "model.layers.0.mlp.down_proj.weight": (HIDDEN, FFN),
    "model.layers.0.input_layernorm.weight": (HIDDEN,),
    "lm_head.weight": (VOCAB, HIDDEN),
}
NORM = HIDDEN * 2  # bf16, never quantized
HEADS = 2 * VOCAB * HIDDEN  # values in the embedding and the LM head
Q, DOWN = HIDDEN * HIDDEN, HIDDEN * FFN  # values in the two linears


def _write_bf16_folder(folder: Path) -> int:
    """A llama safetensors folder with TENSORS in BF16 (zeros: only the header matters here)."""
    folder.mkdir()
    config = {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": FFN, "vocab_size": VOCAB}
    config |= {"num_hidden_layers": 1, "num_attention_heads": 9, "num_key_value_heads": 3}
    (folder / "config.json").write_text(json.dumps(config))
    header, offset = {}, 0
    for name, shape in TENSORS.items():
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))
    return offset


@pytest.mark.parametrize(
    ("isq", "weights"),
    [
        ("q8_0", (HEADS + Q + DOWN) * 34 // 32 + NORM),
        ("q4_k", HEADS * 34 // 32 + Q * 22 // 32 + DOWN * 144 // 256 + NORM),  # 576-wide rows: Q5_0
        ("q4_0", HEADS * 34 // 32 + (Q + DOWN) * 18 // 32 + NORM),
        ("q4", HEADS * 2 + (Q + DOWN) * 5 // 8 + NORM),  # int4 codes + bf16 scale and zero per 32
    ],
)
def test_estimate_sizes_weights_in_the_isq_format(
    tmp_path: Path, isq: str, weights: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALCHAT_KERNEL_LAYOUT", "gguf")  # the file formats (x16: the test below)
    dense = _write_bf16_folder(tmp_path / "m")
    assert estimate(tmp_path / "m", None).weights >= dense  # no --isq: the files as they are
    assert estimate(tmp_path / "m", None, isq).weights == weights
    assert weights < dense


@pytest.mark.skipif(not x16_active(), reason="the kernels do not repack on this CPU (no AVX2)")
def test_estimate_sizes_q4_k_in_the_x16_layout_where_the_kernels_repack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repacked (csrc/lc_x16_layout.h) Q4_K holds 148 bytes per 256 values; Q8_0 and Q5_0 as stored
    (Q5_0 is not repacked; every matrix here has a multiple of 16 rows)."""
    monkeypatch.delenv("LOCALCHAT_KERNEL_LAYOUT", raising=False)
    monkeypatch.delenv("LOCALCHAT_KERNELS", raising=False)
    _write_bf16_folder(tmp_path / "m")
    want = HEADS * 34 // 32 + Q * 22 // 32 + DOWN * 148 // 256 + NORM
    assert estimate(tmp_path / "m", None, "q4_k").weights == want


def test_a_model_that_only_fits_quantized_passes_the_check_under_isq(tmp_path: Path) -> None:
    dense = _write_bf16_folder(tmp_path / "m")
    quantized = estimate(tmp_path / "m", 1, "q4_0")
    room = quantized.total + (dense - quantized.weights) // 2  # between the two sizes
    check_fits("m", quantized, available=room)
    with pytest.raises(InsufficientMemoryError):
        check_fits("m", estimate(tmp_path / "m", 1), available=room)
    assert quantized.kv_cache == MIB


class Built(Exception):
    """The build step was reached: the memory check let the load through."""


def test_the_model_manager_checks_a_load_at_its_isq_size(tmp_path: Path) -> None:
    dense = _write_bf16_folder(tmp_path / "m")
    settings = fake_settings(isq="q4_0")
    quantized = estimate(tmp_path / "m", settings.kv_cache_mib, "q4_0")
    room = quantized.total + (dense - quantized.weights) // 2  # fits quantized, not dense

    def build(*args: object, **kwargs: object) -> None:
        raise Built

    target = ResolvedModel(tmp_path / "m", "m")
    for manager_settings, outcome in ((fake_settings(), InsufficientMemoryError), (settings, Built)):
        manager = ModelManager(manager_settings, build=build, available_memory=lambda: room, mcp=False)
        with pytest.raises(outcome):
            manager._load("m", target)


def test_unreadable_headers_fall_back_to_the_folder_size(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    assert estimate(folder, None, "q4_0").weights == len(b"not a safetensors file")
