"""Qwen3-VL-MoE's language model (30B-A3B, 235B-A22B): Qwen3-MoE's layers + interleaved M-RoPE + image and
DeepStack rows (qwen_vl.py). Loaded from llama.cpp's `qwen3vlmoe` GGUFs, whose experts the converter has
already unpacked into the usual stacked tensors."""

from __future__ import annotations

from localchat.backends.torch.models.qwen3_moe import Qwen3MoeLayer
from localchat.backends.torch.models.qwen_vl import VisionLanguage


class Model(VisionLanguage):
    layer_class = Qwen3MoeLayer
    capturable = False  # expert dispatch sizes its groups on the host (moe.py)
