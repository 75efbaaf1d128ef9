"""Qwen3 (dense): per-head RMSNorm on q and k before RoPE; head_dim may differ from hidden / heads."""

from __future__ import annotations

from backends.mlx.layers import LayerOptions
from backends.mlx.models.base import DecoderLM
from localchat.weights.config import ModelConfig


class Model(DecoderLM):
    @staticmethod
    def layer_options(config: ModelConfig) -> LayerOptions:
        return LayerOptions(qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm=True)
