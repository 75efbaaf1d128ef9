"""Qwen3-VL-MoE's language model on MLX: Qwen3-MoE's layers + interleaved M-RoPE + image and DeepStack
rows, the twin of backends/torch/models/qwen3_vl_moe.py."""

from __future__ import annotations

from localchat.backends.mlx.models.qwen3_moe import Qwen3MoeLayer
from localchat.backends.mlx.models.qwen_vl import VisionLanguage


class Model(VisionLanguage):
    layer_class = Qwen3MoeLayer
