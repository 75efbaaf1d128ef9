"""Qwen2 / Qwen2.5: Llama's layout plus a bias on the q, k and v projections (not on o)."""

from __future__ import annotations

from backends.mlx.layers import LayerOptions
from backends.mlx.models.base import DecoderLM
from localchat.weights.config import ModelConfig


class Model(DecoderLM):
    @staticmethod
    def layer_options(config: ModelConfig) -> LayerOptions:
        return LayerOptions(qkv_bias=config.attention_bias)
