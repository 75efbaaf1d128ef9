"""Layers shared by every architecture: RoPE variants, RMSNorm, the fused attention + SwiGLU block.

Same structure as backends/torch/layers.py: q|k|v and gate|up are fused at load time (when their
formats agree) so a decoder layer costs four matmuls; layers hold bare arrays and call `mx.fast` ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from backends.mlx.quant import Weight, linear
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(slots=True)
class LayerOptions:
    """Per-architecture switches over the shared decoder layer."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # qwen3: RMSNorm over head_dim on q and k before RoPE


def rope_inv_freq(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim / 2] (float32, computed as Hugging Face does) and the output scale."""
    dim, base = config.head_dim, config.rope_theta
    inv_freq = (1.0 / (base ** (np.arange(0, dim, 2).astype(np.float32) / dim))).astype(np.float32)
    scaling: dict[str, Any] = config.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    original = int(scaling.get("original_max_position_embeddings") or config.max_position_embeddings)
    factor = float(scaling.get("factor") or config.max_position_embeddings / original)
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        wavelen = 2 * math.pi / inv_freq
        # Wavelengths past original / low are slowed by `factor`, below original / high kept, between blended.
        blend = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
        mixed = (1 - blend) * inv_freq / factor + blend * inv_freq
        mixed = np.where(wavelen > original / low, inv_freq / factor, mixed)
        return np.where(wavelen < original / high, inv_freq, mixed).astype(np.float32), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, dim, base, factor, original, scaling)
    raise ModelLoadError(
        f"RoPE scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}.",
        code="unsupported_rope",
    )


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


class Rotary:
    """Rotate-half RoPE at explicit per-token positions (a batch mixes requests at different offsets).

    `mx.fast.rope` takes one offset per batch entry, so each token is its own batch entry of length 1:
    x [T, heads, d] -> [T, heads, 1, d] with offset = positions [T]. `traditional=False` is the
    non-interleaved halves layout Hugging Face checkpoints expect; `freqs` are periods (1 / inv_freq).
    """

    def __init__(self, config: ModelConfig) -> None:
        inv_freq, self.scale = rope_inv_freq(config)
        self.periods = mx.array(1.0 / inv_freq.astype(np.float64), dtype=mx.float32)
        self.dims = config.head_dim

    def __call__(self, x: mx.array, positions: mx.array) -> mx.array:
        """x [T, heads, d], positions int32 [T] -> rotated copy."""
        out = mx.fast.rope(
            x[:, :, None, :],
            self.dims,
            traditional=False,
            base=None,
            scale=1.0,
            offset=positions,
            freqs=self.periods,
        )[:, :, 0, :]
        return out if self.scale == 1.0 else out * self.scale


def silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)


@dataclass(slots=True, eq=False)
class DecoderLayer:
    """Pre-norm attention + SwiGLU MLP; weights are filled in by backends/mlx/weights.py."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    options: LayerOptions
    attn_norm: mx.array | None = None  # [hidden]
    qkv: Weight | list[Weight] | None = None  # [(h + 2 kvh) d, hidden], or its parts when not fusable
    qkv_bias: mx.array | None = None
    q_norm: mx.array | None = None  # [head_dim]
    k_norm: mx.array | None = None
    o: Weight | None = None  # [hidden, h d]
    o_bias: mx.array | None = None
    mlp_norm: mx.array | None = None
    gate_up: Weight | list[Weight] | None = None  # [2 intermediate, hidden]
    down: Weight | None = None  # [hidden, intermediate]
    scale: float = field(init=False)

    def __post_init__(self) -> None:
        self.scale = self.head_dim**-0.5

    def __call__(
        self, x: mx.array, rotary: Rotary, positions: mx.array, meta: AttentionMetadata, cache: LayerCache
    ) -> mx.array:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        normed = mx.fast.rms_norm(x, self.attn_norm, self.eps)
        qkv = _project(normed, self.qkv, self.qkv_bias).reshape(tokens, h + 2 * kvh, d)
        q, k, v = qkv[:, :h], qkv[:, h : h + kvh], qkv[:, h + kvh :]
        if self.options.qk_norm:
            q = mx.fast.rms_norm(q, self.q_norm, self.eps)
            k = mx.fast.rms_norm(k, self.k_norm, self.eps)
        q, k = rotary(q, positions), rotary(k, positions)
        attn = paged_attention(q, k, v, cache, meta, self.scale)  # [T, h, d]
        assert self.o is not None and self.down is not None
        x = x + linear(attn.reshape(tokens, h * d), self.o, self.o_bias)
        gate, up = mx.split(_project(mx.fast.rms_norm(x, self.mlp_norm, self.eps), self.gate_up), 2, axis=-1)
        return x + linear(silu(gate) * up, self.down)


def _project(x: mx.array, weight: Weight | list[Weight] | None, bias: mx.array | None = None) -> mx.array:
    """A fused projection, or its parts' outputs side by side when the parts could not be fused."""
    assert weight is not None
    if isinstance(weight, list):
        y = mx.concatenate([linear(x, part) for part in weight], axis=-1)
        return y if bias is None else y + bias
    return linear(x, weight, bias)
