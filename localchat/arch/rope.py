"""RoPE inverse frequencies for every scaling type we support, in numpy, shared by all backends.

Each backend turns the result into its own cos/sin tables; computing them here keeps the scaling maths
(llama3's band blend, yarn's ramp and attention factor) in one place, checked once against transformers.

longrope (Phi-3 / Phi-4-mini, alias `su`) has two factor lists. transformers picks them per sequence
(the long ones once it outgrows `original_max_position_embeddings`, recomputing the whole cache at that
point); a paged cache cannot re-rotate cached keys, so, like llama.cpp and vLLM, we pick one list per
served context: the short factors while the engine's context length is at most the original length
(the same tables as transformers for every sequence), the long ones for all tokens when it is longer
(transformers' tables for sequences past the original length; shorter ones then differ from it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.errors import ModelLoadError

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_inv_freq(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies float32 [rotary_dim / 2] (computed in float32, as transformers does) and the
    scale applied to cos and sin (yarn's attention factor; 1.0 for the others)."""
    dim, base = config.rotary_dim, config.rope_theta
    # base ** (2i / dim) rounded once to float32, as torch's pow does: the same bits as transformers' table.
    exponents = (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)).astype(np.float64)
    inv_freq = np.float32(1.0) / np.power(np.float64(base), exponents).astype(np.float32)
    scaling: dict[str, Any] = config.rope_scaling or {}
    kind = _kind(scaling)
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
    if kind == "longrope":
        return _longrope(dim, base, scaling["short_factor"]), _longrope_attention_factor(config, original)
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


def rope_long_inv_freq(config: ModelConfig) -> tuple[np.ndarray, int] | None:
    """longrope only: the long-factor inverse frequencies and the original length past which a served
    context uses them (`rope_inv_freq` gives the short-factor ones). None for other RoPE types."""
    scaling: dict[str, Any] = config.rope_scaling or {}
    if _kind(scaling) != "longrope":
        return None
    original = int(scaling.get("original_max_position_embeddings") or config.max_position_embeddings)
    return _longrope(config.rotary_dim, config.rope_theta, scaling["long_factor"]), original


def _kind(scaling: dict[str, Any]) -> str:
    kind = str(scaling.get("rope_type", "default"))
    return "longrope" if kind == "su" else kind  # `su`: longrope's name in early Phi-3 configs


def _longrope(dim: int, base: float, factors: list[float]) -> np.ndarray:
    ext = np.asarray(factors, dtype=np.float32)
    if ext.shape != (dim // 2,):
        raise ModelLoadError(
            f"longrope factor list has {ext.size} entries, expected {dim // 2} (rotary dim / 2); the "
            "model's config.json is inconsistent.",
            code="unsupported_rope",
        )
    exponents = (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)).astype(np.float64)
    powers = np.power(np.float64(base), exponents).astype(np.float32)
    return (np.float32(1.0) / (ext * powers)).astype(np.float32)


def _longrope_attention_factor(config: ModelConfig, original: int) -> float:
    scaling: dict[str, Any] = config.rope_scaling or {}
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    # Phi-3 derives the factor from the context extension, not from `factor` (as transformers does).
    factor = float(scaling.get("factor") or config.max_position_embeddings / original)
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def attention_temperature(config: ModelConfig) -> tuple[float, int] | None:
    """Llama 4-style attention temperature (Ministral 3): (beta, length) such that q is scaled after
    RoPE by 1 + beta * log(1 + floor(position / length)), sharpening attention past each multiple of
    the pretraining length. None when the config sets no beta (the layer is then plain Mistral)."""
    beta = config.extra.get("llama_4_scaling_beta")
    if not beta:
        return None
    length = (config.rope_scaling or {}).get("original_max_position_embeddings")
    if not length:
        raise ModelLoadError(
            "The config sets llama_4_scaling_beta but no rope original_max_position_embeddings, which "
            "that scaling needs; the model's config.json (or GGUF metadata) is incomplete.",
            code="unsupported_rope",
        )
    return float(beta), int(length)
