"""Ops the model files compose: RoPE at explicit positions, SiLU, fused projections.

Same structure as localchat/backends/torch/layers.py: q|k|v and gate|up are fused at load time (when their
formats agree) so a Llama layer costs four matmuls; layers hold bare arrays and call `mx.fast` ops.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localchat.arch.rope import rope_inv_freq, rope_long_inv_freq
from localchat.backends.mlx.quant import Weight, linear
from localchat.weights.config import ModelConfig


class Rotary:
    """Rotate-half RoPE at explicit per-token positions (a batch mixes requests at different offsets).

    `mx.fast.rope` takes one offset per batch entry, so each token is its own batch entry of length 1:
    x [T, heads, d] -> [T, heads, 1, d] with offset = positions [T]. `traditional=False` is the
    non-interleaved halves layout Hugging Face checkpoints expect; `freqs` are periods (1 / inv_freq).
    """

    def __init__(self, config: ModelConfig) -> None:
        inv_freq, self.scale = rope_inv_freq(config)
        self.periods = mx.array(1.0 / inv_freq.astype(np.float64), dtype=mx.float32)
        self.dims = config.rotary_dim  # below head_dim: the remaining dims pass through unturned
        self.long = rope_long_inv_freq(config)  # longrope: the table for contexts past the original length

    def serve_context(self, max_model_len: int) -> None:
        """longrope: one factor list for the whole served context (localchat/arch/rope.py)."""
        if self.long is not None and max_model_len > self.long[1]:
            self.periods = mx.array(1.0 / self.long[0].astype(np.float64), dtype=mx.float32)

    def __call__(self, x: mx.array, positions: mx.array) -> mx.array:
        """x [T, heads, d], positions int32 [T] -> rotated copy."""
        out = self._rope(x, positions, self.periods)
        if self.scale == 1.0:
            return out
        if self.dims == x.shape[-1]:
            return out * self.scale
        # The attention factor scales cos and sin: the dims that do not turn stay as they are.
        return mx.concatenate([out[..., : self.dims] * self.scale, out[..., self.dims :]], axis=-1)

    def _rope(self, x: mx.array, positions: mx.array, periods: mx.array) -> mx.array:
        return mx.fast.rope(
            x[:, :, None, :],
            self.dims,
            traditional=False,
            base=None,
            scale=1.0,
            offset=positions,
            freqs=periods,
        )[:, :, 0, :]


def silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)


def project(x: mx.array, weight: Weight | list[Weight] | None, bias: mx.array | None = None) -> mx.array:
    """A fused projection, or its parts' outputs side by side when the parts could not be fused."""
    assert weight is not None
    if isinstance(weight, list):
        y = mx.concatenate([linear(x, part) for part in weight], axis=-1)
        return y if bias is None else y + bias
    return linear(x, weight, bias)
