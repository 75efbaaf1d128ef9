"""Qwen2.5-VL's language model on MLX: Qwen2 (Llama's layer with q/k/v biases) + M-RoPE + image rows."""

from __future__ import annotations

from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.backends.mlx.models.qwen_vl import VisionLanguage


class Model(VisionLanguage):
    layer_class = LlamaLayer
