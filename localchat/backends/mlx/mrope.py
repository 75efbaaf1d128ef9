"""M-RoPE on MLX, the twin of localchat/backends/torch/mrope.py: each rotary frequency turns with one of
(temporal, height, width) per `mrope_section`; 1-D positions (no pictures in the step) take the plain
RoPE path."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localchat.arch.rope import rope_inv_freq
from localchat.backends.mlx.layers import Rotary
from localchat.weights.config import ModelConfig


def frequency_axes(section: list[int], interleaved: bool, count: int) -> np.ndarray:
    """The position axis (0 t, 1 h, 2 w) of each of the `count` rotary frequencies."""
    axes = np.zeros(count, dtype=np.int32)
    if interleaved:
        for axis in (1, 2):
            axes[axis : section[axis] * 3 : 3] = axis
    else:
        axes[section[0] : section[0] + section[1]] = 1
        axes[section[0] + section[1] : sum(section)] = 2
    return axes


class MRotary(Rotary):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        inv_freq, _ = rope_inv_freq(config)
        self.inv_freq = mx.array(inv_freq.astype(np.float32))
        section = [int(s) for s in config.extra["mrope_section"]]
        axes = frequency_axes(section, bool(config.extra.get("mrope_interleaved")), len(inv_freq))
        self.axes = mx.array(axes)

    def __call__(self, x: mx.array, positions: mx.array) -> mx.array:
        """x [T, heads, d]; positions int32 [T] or [3, T] (t, h, w per token) -> rotated copy."""
        if positions.ndim == 1:
            return super().__call__(x, positions)
        angles = positions.astype(mx.float32)[self.axes].T * self.inv_freq  # [T, d/2]
        cos, sin = mx.cos(angles)[:, None, :], mx.sin(angles)[:, None, :]
        half = angles.shape[-1]
        x1, x2 = x[..., :half].astype(mx.float32), x[..., half : 2 * half].astype(mx.float32)
        turned = mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
        return turned if 2 * half == x.shape[-1] else mx.concatenate([turned, x[..., 2 * half :]], axis=-1)
