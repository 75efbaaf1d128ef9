"""Qwen2.5-VL's language model: Qwen2 (Llama's layer with q/k/v biases) + M-RoPE + image rows (qwen_vl.py)."""

from __future__ import annotations

from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.models.qwen_vl import VisionLanguage


class Model(VisionLanguage):
    layer_class = LlamaLayer
