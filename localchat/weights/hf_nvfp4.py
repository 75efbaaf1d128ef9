"""Hugging Face NVFP4 checkpoints, repacked at load into GGUF NVFP4 blocks (weights/lowbit.py), which the
CPU kernels run compact and MLX keeps in its nvfp4 mode (elsewhere: dequantized at load).

Two layouts, one format: per linear, uint8 codes [out, in / 2] (E2M1, input 2k in the low nibble of byte k,
2k + 1 in the high one), an E4M3 scale per 16 inputs [out, in / 16], and one float32 per-tensor scale:
- NVIDIA ModelOpt (`quant_method: modelopt`, `quant_algo: NVFP4`): `weight`, `weight_scale`,
  `weight_scale_2`; value = e2m1 x scale x weight_scale_2.
- compressed-tensors `nvfp4-pack-quantized`: `weight_packed`, `weight_scale`, `weight_global_scale`;
  value = e2m1 x scale / weight_global_scale.
Activation scales (`input_scale`, `input_global_scale`) are dropped: activations stay bf16 / fp32 here.

GGUF NVFP4 has no per-tensor scale, so it is folded into each per-16 scale: the new scale byte is the
unsigned E4M3 nearest to scale x global. That is exact where the product is an E4M3 value (a power-of-two
global scale in range: every scale byte moves by a whole number of binades); otherwise each 16 values
move together by under half an E4M3 step (2^-4 relative) and the codes stay: on random normal weights
quantized the ModelOpt way (global amax / (6 x 448)), relative RMS error 0.029 against the checkpoint's
values, NVFP4's own 0.095, together 0.099 (tests/backends/test_hf_nvfp4.py). Tried and measured equal
(0.0289 each): re-picking every code on the new scale's grid, and taking whichever of the two E4M3
scales around scale x global holds each 16 values closer. With one global scale per tensor, scale x
global lands at one of only 8 offsets from the E4M3 grid, and E2M1's steps are too coarse for a few
percent to move a code. Rows whose inputs are not a multiple of
64 (GGUF's block) are dequantized exactly to float32 instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.lowbit import E2M1_DOUBLED, UE4M3_HALF
from localchat.weights.tensors import WeightTensor

log = logging.getLogger(__name__)

MODELOPT, COMPRESSED = "modelopt", "nvfp4-pack-quantized"
NVFP4_METHODS = (MODELOPT, COMPRESSED)
# each layout's tensor names -> (role)
_PARTS = {
    MODELOPT: {"weight": "codes", "weight_scale": "scales", "weight_scale_2": "global"},
    COMPRESSED: {"weight_packed": "codes", "weight_scale": "scales", "weight_global_scale": "inverse"},
}
_DROPPED = ("input_scale", "input_global_scale", "weight_shape", "k_scale", "v_scale")
_E4M3 = 2 * UE4M3_HALF[:0x7F].astype(np.float64)  # every finite non-negative E4M3 value, bytes 0 .. 0x7E


def nvfp4_method(qc: dict[str, Any]) -> str | None:
    """MODELOPT / COMPRESSED for an NVFP4 quantization_config, None for other methods."""
    method = str(qc.get("quant_method", "")).lower()
    if method == MODELOPT:
        algo = str(qc.get("quant_algo", "")).upper()
        if algo != "NVFP4":
            raise ModelLoadError(f"ModelOpt quant_algo {algo!r} is not supported; localchat reads NVFP4.")
        return MODELOPT
    groups = (qc.get("config_groups") or {}).values()
    formats = {str(qc.get("format", ""))} | {str((g or {}).get("format", "")) for g in groups}
    return COMPRESSED if method == "compressed-tensors" and COMPRESSED in formats else None


def nvfp4_stream(tensors: Iterator[WeightTensor], method: str) -> Iterator[WeightTensor]:
    """The checkpoint's tensors with every NVFP4 linear as one GGUF NVFP4 WeightTensor (or float32)."""
    pending: dict[str, dict[str, WeightTensor]] = {}
    folded = {"exact": 0, "rounded": 0, "float32": 0}
    for t in tensors:
        module, _, part = t.name.rpartition(".")
        role = _PARTS[method].get(part)
        if part in _DROPPED:
            continue
        if role is None or (role == "codes" and t.dtype not in ("U8", "I8")):  # an unquantized tensor
            yield t
            continue
        parts = pending.setdefault(module, {})
        parts[role] = t
        if len(parts) == 3:
            del pending[module]
            weight, how = nvfp4_linear(f"{module}.weight", parts)
            folded[how] += 1
            yield weight
    if pending:
        module, parts = next(iter(pending.items()))
        raise ModelLoadError(
            f"NVFP4 layer {module} has only {sorted(parts)} of its codes, scales and global scale."
        )
    log.info(
        "NVFP4 checkpoint: %d linears as GGUF NVFP4 blocks (per-tensor scale folded exactly in %d, to the nearest "
        "E4M3 in %d), %d dequantized (inputs not a multiple of 64)",
        folded["exact"] + folded["rounded"],
        folded["exact"],
        folded["rounded"],
        folded["float32"],
    )


def nvfp4_linear(name: str, parts: dict[str, WeightTensor]) -> tuple[WeightTensor, str]:
    """One linear's codes, scales and global scale -> (its weight, "exact" | "rounded" | "float32")."""
    codes = np.asarray(parts["codes"].data).view(np.uint8)
    scales = np.asarray(parts["scales"].data).view(np.uint8)
    rows, cols = codes.shape[0], codes.shape[-1] * 2
    if scales.shape != (rows, cols // 16) or codes.ndim != 2:
        raise ModelLoadError(f"NVFP4 {name}: codes {codes.shape} and scales {scales.shape} do not agree.")
    if ((scales & 0x7F) == 0x7F).any():
        raise ModelLoadError(f"NVFP4 {name}: a scale is NaN; the checkpoint is damaged.")
    given = parts["global"] if "global" in parts else parts["inverse"]
    g = float(given.dequantize().reshape(-1)[0])
    g = g if "global" in parts else 1.0 / g
    nibbles = np.stack([codes & 15, codes >> 4], axis=-1).reshape(rows, cols // 16, 16)
    nibbles ^= ((scales & 0x80) >> 4)[..., None]  # a negative scale: the codes' sign bits flip instead
    target = _E4M3[scales & 0x7F] * g  # float64: the exact scale x global
    if cols % 64:
        values = E2M1_DOUBLED[nibbles].astype(np.float64) / 2 * target[..., None]
        return WeightTensor(
            name, (rows, cols), "F32", values.reshape(rows, cols).astype(np.float32)
        ), "float32"
    folded = _nearest_e4m3(target)
    exact = bool((_E4M3[folded] == target).all())
    halves = nibbles[..., :8] | (nibbles[..., 8:] << 4)  # GGUF: value j low, j + 8 high, per 16
    blocks = np.concatenate(
        [folded.reshape(rows, -1, 4), halves.reshape(rows, -1, 32).astype(np.uint8)], axis=-1
    ).reshape(rows, -1)
    return WeightTensor(
        name, (rows, cols), "NVFP4", np.ascontiguousarray(blocks)
    ), "exact" if exact else "rounded"


def _nearest_e4m3(x: np.ndarray) -> np.ndarray:
    """The byte of the E4M3 value nearest each x >= 0 (the lower on ties; 448 above the range)."""
    hi = np.clip(np.searchsorted(_E4M3, x), 1, len(_E4M3) - 1)
    lower = x - _E4M3[hi - 1] <= _E4M3[hi] - x
    return np.where(lower, hi - 1, hi).astype(np.uint8)


def nvfp4_loaded_bytes(headers: list[dict[str, Any]], value_bytes: int, compact: bool) -> int:
    """Bytes an NVFP4 folder's weights take once loaded, from its safetensors headers: the linears as
    GGUF NVFP4 blocks where a backend keeps them (`compact`: the codes and the scale bytes, 4.5 bits a
    weight, as in the file) or at `value_bytes` a value, the other tensors as stored, activation and
    global scales nothing."""
    total = 0
    for header in headers:
        for name, info in header.items():
            part = name.rpartition(".")[2]
            begin, end = (int(v) for v in info["data_offsets"])
            if part in _DROPPED or part in ("weight_scale_2", "weight_global_scale"):
                continue
            if info["dtype"] in ("U8", "I8") and part in ("weight", "weight_packed"):
                total += end - begin if compact else 2 * (end - begin) * value_bytes
            elif info["dtype"] == "F8_E4M3" and part == "weight_scale":
                total += end - begin if compact else 0
            else:
                total += end - begin
    return total
