"""M-RoPE (Qwen2-VL family): each rotary frequency turns with one of three position axes, (temporal,
height, width), chosen by `mrope_section` - in consecutive blocks (Qwen2-VL, Qwen2.5-VL) or interleaved
t, h, w, t, h, w, ... (Qwen3-VL). Given 1-D positions (a batch without pictures) all three axes are the
same position and the tables are plain RoPE's, so text-only steps stay on the usual path."""

from __future__ import annotations

import numpy as np
import torch

from localchat.backends.torch.layers import Rotary
from localchat.weights.config import ModelConfig


def frequency_axes(section: list[int], interleaved: bool, count: int) -> np.ndarray:
    """The position axis (0 t, 1 h, 2 w) of each of the `count` rotary frequencies."""
    axes = np.zeros(count, dtype=np.int64)
    if interleaved:
        for axis in (1, 2):
            axes[axis : section[axis] * 3 : 3] = axis
    else:
        axes[section[0] : section[0] + section[1]] = 1
        axes[section[0] + section[1] : sum(section)] = 2
    return axes


class MRotary(Rotary):
    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        section = [int(s) for s in config.extra["mrope_section"]]
        interleaved = bool(config.extra.get("mrope_interleaved"))
        axes = frequency_axes(section, interleaved, int(self.inv_freq.shape[0]))
        self.axes = torch.from_numpy(axes).to(device)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] (text only) or [3, T] (t, h, w per token) -> cos, sin [T, 1, rotary_dim]."""
        if positions.dim() == 1:
            return super().__call__(positions, dtype)
        per_frequency = positions.float()[self.axes].T  # [T, d/2]: each frequency's own axis
        freqs = per_frequency * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        cos_full = torch.cat((cos, cos), dim=-1)[:, None, :].to(dtype)
        sin_signed = torch.cat((-sin, sin), dim=-1)[:, None, :].to(dtype)
        return cos_full, sin_signed
