"""Qwen3-VL's language model: Qwen3 (q/k RMSNorm) + interleaved M-RoPE + image and DeepStack rows
(qwen_vl.py)."""

from __future__ import annotations

from localchat.backends.torch.models.qwen3 import Qwen3Layer
from localchat.backends.torch.models.qwen_vl import VisionLanguage


class Model(VisionLanguage):
    layer_class = Qwen3Layer
