"""RoPE inverse frequencies for every scaling type we support, in numpy, shared by all backends.

Each backend turns the result into its own cos/sin tables; computing them here keeps the scaling maths
(llama3's band blend, yarn's ramp and attention factor) in one place, checked once against transformers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.errors import ModelLoadError

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_inv_freq(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies float32 [rotary_dim / 2] (computed in float32, as transformers does) and the
    scale applied to cos and sin (yarn's attention factor; 1.0 for the others)."""
    dim, base = config.rotary_dim, config.rope_theta
    # base ** (2i / dim) rounded once to float32, as torch's pow does: the same bits as transformers' table.
    exponents = (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)).astype(np.float64)
    inv_freq = np.float32(1.0) / np.power(np.float64(base), exponents).astype(np.float32)
    scaling: dict[str, Any] = config.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    original = int(scaling.get("original_max_position_embeddings") or config.max_position_embeddings)
    factor = float(scaling.get("factor") or config.max_position_embeddings / original)
    if kind == "linear":
        return (inv_freq / factor).astype(np.float32), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, factor, original, scaling), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, dim, base, factor, original, scaling)
    raise ModelLoadError(
        f"RoPE scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}.",
        code="unsupported_rope",
    )


def _llama3(inv_freq: np.ndarray, factor: float, original: int, scaling: dict[str, Any]) -> np.ndarray:
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq
    # Wavelengths past original / low are slowed by `factor`, below original / high kept, between blended.
    blend = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
    mixed = (1 - blend) * inv_freq / factor + blend * inv_freq
    mixed = np.where(wavelen > original / low, inv_freq / factor, mixed)
    return np.where(wavelen < original / high, inv_freq, mixed).astype(np.float32)


def _yarn(
    inv_freq: np.ndarray, dim: int, base: float, factor: float, original: int, scaling: dict[str, Any]
) -> tuple[np.ndarray, float]:
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def boundary(rotations: float) -> float:  # the dim index that turns `rotations` times over `original`
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = boundary(scaling.get("beta_fast") or 32), boundary(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    # 1 keeps the original frequency (extrapolation), 0 takes the interpolated one.
    keep = 1 - np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    return (inv_freq / factor * (1 - keep) + inv_freq * keep).astype(np.float32), float(attention_factor)
