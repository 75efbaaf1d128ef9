"""Qwen3-VL's language model on MLX: Qwen3 (q/k RMSNorm) + interleaved M-RoPE + image and DeepStack rows."""

from __future__ import annotations

from localchat.backends.mlx.models.qwen3 import Qwen3Layer
from localchat.backends.mlx.models.qwen_vl import VisionLanguage


class Model(VisionLanguage):
    layer_class = Qwen3Layer
