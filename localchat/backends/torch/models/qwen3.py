"""Qwen3 (dense): Llama's layer plus a per-head RMSNorm on q and k before RoPE; head_dim may differ
from hidden / heads."""

from __future__ import annotations

import torch

from localchat.backends.torch.layers import empty_param, rms_norm
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class Qwen3Layer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        # q_norm's weight repeated per q head, then k_norm's per k head: one multiply for both.
        self.qk_norm = empty_param(self.heads + self.kv_heads, self.head_dim)

    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:
        return rms_norm(qk, None, self.eps) * self.qk_norm


class Model(DecoderLM):
    layer_class = Qwen3Layer
