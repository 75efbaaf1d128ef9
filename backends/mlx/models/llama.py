"""Llama 2 / 3 / 3.1 / 3.2, and checkpoints sharing its layout (SmolLM2, Yi, DeepSeek-R1-Distill-Llama)."""

from __future__ import annotations

from backends.mlx.layers import LayerOptions
from backends.mlx.models.base import DecoderLM
from localchat.weights.config import ModelConfig


class Model(DecoderLM):
    @staticmethod
    def layer_options(config: ModelConfig) -> LayerOptions:
        # `attention_bias` puts a bias on q, k, v and o alike in Llama.
        return LayerOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias)
