"""Qwen3 (dense): Llama's layer plus a per-head RMSNorm on q and k before RoPE; head_dim may differ
from hidden / heads."""

from __future__ import annotations

import mlx.core as mx

from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class Qwen3Layer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.q_norm: mx.array | None = None
        self.k_norm: mx.array | None = None
        self.declare("q_norm", self.head_dim)
        self.declare("k_norm", self.head_dim)

    def normalize_qk(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        return mx.fast.rms_norm(q, self.q_norm, self.eps), mx.fast.rms_norm(k, self.k_norm, self.eps)


class Model(DecoderLM):
    layer_class = Qwen3Layer
