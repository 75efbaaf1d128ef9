"""Recover Llama 3.1-style rope scaling from the `rope_freqs.weight` tensor llama.cpp writes instead.

The converter stores one wavelength multiplier per rotary frequency: 1 for short wavelengths, `factor`
for long ones, and a smooth blend in between. The blend is linear in 1/wavelength, so two points of it
give back `low_freq_factor`, `high_freq_factor` and `original_max_position_embeddings` up to one common
scale, which cancels out; we pick the one that makes low_freq_factor ~1 (Llama 3.x uses exactly 1).
With fewer blend points (tiny head_dim) any parameters that reproduce the stored factors will do; the
result is always checked against them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from localchat.errors import ModelLoadError

_TOL = 1e-4


def llama3_multipliers(params: dict[str, Any], theta: float, head_dim: int) -> np.ndarray:
    """The per-frequency wavelength multipliers a llama3 rope_scaling dict implies. [head_dim // 2]"""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    context = float(params["original_max_position_embeddings"])
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (context / wavelen - low) / (high - low)
    blended = 1.0 / ((1.0 - smooth) / factor + smooth)
    return np.where(wavelen < context / high, 1.0, np.where(wavelen > context / low, factor, blended))


def llama3_scaling_from_factors(factors: np.ndarray, theta: float, head_dim: int) -> dict[str, Any] | None:
    """A HF `rope_scaling` dict ({"rope_type": "llama3", ...}) reproducing `factors`, or None if all are 1."""
    factors = factors.reshape(-1)
    if factors.shape[0] != head_dim // 2:
        raise ModelLoadError(f"rope_freqs has {factors.shape[0]} entries, expected {head_dim // 2}.")
    factor = float(factors.max())
    if factor <= 1.0 + _TOL:
        return None
    inv_wavelen = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim) / (2 * math.pi)
    blend = (factors > 1.0 + _TOL) & (factors < factor * (1 - _TOL))
    if blend.sum() >= 1:
        # smooth = a / wavelen - b, with a = context / (high - low) and b = low / (high - low)
        x = inv_wavelen[blend]
        smooth = (1.0 / factors[blend] - 1.0 / factor) / (1.0 - 1.0 / factor)
        if len(x) >= 2:
            a, neg_b = np.polyfit(x, smooth, 1)
        else:  # one point: the steepest line through it that keeps its neighbours at 1 and at `factor`
            x_full = inv_wavelen[factors >= factor * (1 - _TOL)].max()
            x_one = inv_wavelen[factors <= 1.0 + _TOL].min(initial=2 * x[0])
            a = 1.05 * max(smooth[0] / (x[0] - x_full), (1 - smooth[0]) / (x_one - x[0]))
            neg_b = smooth[0] - a * x[0]
        high, context = 1.0 - 1.0 / neg_b, -a / neg_b
    else:
        # No blend at all: put both edges halfway (geometrically) between the last 1 and the first `factor`.
        wavelen = 1.0 / inv_wavelen
        ones = factors <= 1.0 + _TOL
        short = float(wavelen[ones].max()) if ones.any() else float(wavelen.min()) / 2
        long_ = float(wavelen[factors >= factor * (1 - _TOL)].min())
        context = math.sqrt(short * long_)
        high = math.sqrt(context / short)
    # Scale the three together (which changes nothing) so the context length comes out a whole number.
    scale = max(round(float(context)), 1) / float(context)
    params = {
        "rope_type": "llama3",
        "factor": round(factor, 6),
        "low_freq_factor": round(scale, 6),
        "high_freq_factor": round(float(high) * scale, 6),
        "original_max_position_embeddings": max(round(float(context)), 1),
    }
    if not np.allclose(llama3_multipliers(params, theta, head_dim), factors, rtol=1e-3):
        raise ModelLoadError(
            "This GGUF's rope_freqs tensor does not follow Llama 3-style rope scaling; it cannot be run."
        )
    return params
