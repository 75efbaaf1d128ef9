"""Hugging Face NVFP4 checkpoints (NVIDIA ModelOpt `quant_algo: NVFP4`, compressed-tensors
`nvfp4-pack-quantized`), packed here from the documented format, repacked at load into GGUF NVFP4 blocks
(localchat/weights/hf_nvfp4.py): exact where the per-tensor scale is a power of two, else each per-16 scale
rounded to the nearest E4M3 (error stated and bounded below); the tiny Llama runs on the kernels' blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.models.memory import _hf_quant_weights
from localchat.weights.hf_nvfp4 import COMPRESSED, MODELOPT, nvfp4_linear
from localchat.weights.loader import load_model
from localchat.weights.lowbit import E2M1_DOUBLED, UE4M3_HALF, dequantize_lowbit
from localchat.weights.tensors import WeightTensor
from tests.backends.test_hf_quant_compact import SHAPE, compact_runner, linears, run
from tests.helpers.quant_folders import save_quantized_llama
from tests.helpers.torch_models import fp32_runner, tiny_hf_model

E4M3 = 2 * UE4M3_HALF[:0x7F].astype(np.float64)
E2M1 = E2M1_DOUBLED.astype(np.float64) / 2


def _nearest(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.abs(x[..., None] - table).argmin(axis=-1).astype(np.uint8)


def quantize_nvfp4(w: np.ndarray, global_scale: float | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """ModelOpt's recipe: global g = amax / (6 x 448) (or the one given), per-16 scale amax16 / 6 / g as
    E4M3, codes the nearest E2M1 of w / (scale g). -> (codes uint8 [out, in / 2], scales [out, in / 16], g)."""
    rows, cols = w.shape
    g = float(np.abs(w).max() / (6 * 448)) if global_scale is None else global_scale
    groups = w.astype(np.float64).reshape(rows, -1, 16)
    scales = _nearest(E4M3, np.abs(groups).max(-1) / 6 / g)
    codes = _nearest(E2M1, groups / (E4M3[scales][..., None] * g)).reshape(rows, cols)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), scales, g


def exact_values(codes: np.ndarray, scales: np.ndarray, g: float) -> np.ndarray:
    rows = codes.shape[0]
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(rows, -1, 16)
    return (E2M1[nibbles] * E4M3[scales][..., None] * g).reshape(rows, -1)


def modelopt_quantizer(w: np.ndarray) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    codes, scales, g = quantize_nvfp4(w)
    parts = {
        "weight": torch.from_numpy(codes),
        "weight_scale": torch.from_numpy(scales).view(torch.float8_e4m3fn),
        "weight_scale_2": torch.tensor(g, dtype=torch.float32),
        "input_scale": torch.tensor(1.0, dtype=torch.float32),
    }
    return parts, exact_values(codes, scales, float(np.float32(g))).astype(np.float32)


MODELOPT_CONFIG: dict[str, Any] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}


def compressed_quantizer(w: np.ndarray) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """compressed-tensors' names; its global scale is the inverse of the multiplier."""
    codes, scales, g = quantize_nvfp4(w)
    inverse = np.float32(1 / g)
    parts = {
        "weight_packed": torch.from_numpy(codes),
        "weight_scale": torch.from_numpy(scales).view(torch.float8_e4m3fn),
        "weight_global_scale": torch.tensor([inverse], dtype=torch.float32),
        "input_global_scale": torch.tensor([1.0], dtype=torch.float32),
    }
    return parts, exact_values(codes, scales, 1 / float(inverse)).astype(np.float32)


COMPRESSED_CONFIG: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
            "format": "nvfp4-pack-quantized",
        }
    },
}
FOLDERS = {
    MODELOPT: (modelopt_quantizer, MODELOPT_CONFIG),
    COMPRESSED: (compressed_quantizer, COMPRESSED_CONFIG),
}


def _tensors(codes: np.ndarray, scales: np.ndarray, g: float, method: str) -> dict[str, WeightTensor]:
    given = np.array([g if method == MODELOPT else 1 / g], dtype=np.float32)
    return {
        "codes": WeightTensor("w.weight", codes.shape, "U8", codes),
        "scales": WeightTensor("w.weight_scale", scales.shape, "F8_E4M3", scales),
        ("global" if method == MODELOPT else "inverse"): WeightTensor("w.g", (1,), "F32", given),
    }


@pytest.mark.parametrize("method", [MODELOPT, COMPRESSED])
def test_power_of_two_global_scale_repacks_exactly(method: str) -> None:
    w = np.random.default_rng(1).standard_normal((24, 256)).astype(np.float32)
    codes, scales, g = quantize_nvfp4(w, global_scale=2.0**-6)
    scales[0, :3] |= 0x80  # negative scales flip the codes' signs instead
    weight, how = nvfp4_linear("w.weight", _tensors(codes, scales, g, method))
    assert (weight.dtype, how) == ("NVFP4", "exact")
    want = exact_values(codes, scales & 0x7F, g)
    want[0, :48] *= -1
    np.testing.assert_array_equal(dequantize_lowbit(weight.data, "NVFP4").reshape(w.shape), want)


def test_other_global_scales_fold_within_half_an_e4m3_step() -> None:
    """Each value moves by at most 2^-4 of its group's largest; on normal weights (seed 2) the folding is
    0.029 relative RMS from the checkpoint's values, NVFP4's own error 0.095, both together 0.099."""
    w = np.random.default_rng(2).standard_normal((64, 1024)).astype(np.float32)
    codes, scales, g = quantize_nvfp4(w)
    weight, how = nvfp4_linear("w.weight", _tensors(codes, scales, g, MODELOPT))
    assert (weight.dtype, how) == ("NVFP4", "rounded")
    exact = exact_values(codes, scales, float(np.float32(g)))
    kept = dequantize_lowbit(weight.data, "NVFP4").reshape(w.shape).astype(np.float64)
    groups = np.abs(exact).reshape(64, -1, 16).max(-1)
    moved = np.abs(kept - exact).reshape(64, -1, 16).max(-1)
    assert (moved <= groups * 2.0**-4 * 1.0001 + 1e-12).all()

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.sqrt(((a - b) ** 2).mean() / (b**2).mean()))

    own, folded, total = rel(exact, w), rel(kept, exact), rel(kept, w)
    print(f"\nNVFP4 own {own:.4f}, folding {folded:.4f}, together {total:.4f}")
    assert own < 0.11 and folded < 0.05 and total < own * 1.05


def test_rows_not_whole_blocks_are_dequantized() -> None:
    w = np.random.default_rng(3).standard_normal((8, 96)).astype(np.float32)
    codes, scales, g = quantize_nvfp4(w)
    weight, how = nvfp4_linear("w.weight", _tensors(codes, scales, g, MODELOPT))
    assert (weight.dtype, how) == ("F32", "float32")
    np.testing.assert_allclose(weight.data, exact_values(codes, scales, float(np.float32(g))), rtol=1e-6)


@pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")
@pytest.mark.parametrize("layout", [MODELOPT, COMPRESSED])
def test_checkpoint_runs_on_nvfp4_blocks(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every layer linear becomes GGUF NVFP4 blocks on the kernels; the compact run follows the exact
    dequantized fp32 run (same greedy tokens; logits within the folding's and the activations' rounding),
    and the RAM estimate counts the linears at 4.5 bits a weight."""
    hf = tiny_hf_model("llama", **SHAPE)
    save_quantized_llama(tmp_path, hf, *FOLDERS[layout])
    exact = fp32_runner(load_model(tmp_path))
    compact = compact_runner(tmp_path, monkeypatch)
    blocks = linears(compact)
    assert all(isinstance(m, BlockMatrix) for m in blocks)
    assert {s.qtype for m in blocks for s in m.segments} == {"NVFP4"}  # type: ignore[attr-defined]
    ref_logits, ref_tokens = run(exact)
    got_logits, got_tokens = run(compact)
    diff = float((got_logits - ref_logits).abs().max())
    print(f"\n{layout} NVFP4 tiny Llama: max |logit diff| {diff:.4f}")
    assert got_tokens == ref_tokens and diff < 0.01  # measured 0.0011
    weights = sum(
        p.numel() for n, p in hf.named_parameters() if "layers." in n and n.endswith("_proj.weight")
    )
    others = sum(
        p.numel() for n, p in hf.named_parameters() if not ("layers." in n and n.endswith("_proj.weight"))
    )
    estimate = _hf_quant_weights(tmp_path, 4, 0, blocks=True)
    assert estimate == weights * 9 // 16 + others * 4  # float32 others as stored, linears at 4.5 bits
