"""Mistral (7B v0.1-v0.3, Nemo, Ministral): Llama's layout without biases.

NOTE: `sliding_window` is recorded in the config but attention stays full-context, as in the torch
backend; this matches the reference for every sequence shorter than the window.
"""

from __future__ import annotations

from backends.mlx.layers import LayerOptions
from backends.mlx.models.base import DecoderLM
from localchat.weights.config import ModelConfig


class Model(DecoderLM):
    @staticmethod
    def layer_options(config: ModelConfig) -> LayerOptions:
        return LayerOptions()
