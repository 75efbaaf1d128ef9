"""The decoder-only causal LM every supported architecture shares; model files pick `LayerOptions`."""

from __future__ import annotations

import mlx.core as mx

from backends.mlx.attention import AttentionMetadata, LayerCache
from backends.mlx.layers import DecoderLayer, LayerOptions, Rotary
from backends.mlx.quant import Embedding, Weight, linear, take_rows
from localchat.weights.config import ModelConfig


class DecoderLM:
    """embed -> N x (attention + SwiGLU) -> RMSNorm -> LM head (tied to the embedding when configured).

    Arrays start empty (None) and are filled by backends/mlx/weights.py.
    """

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        options = self.layer_options(config)
        self.embed: Embedding | None = None  # [vocab, hidden]
        self.layers = [
            DecoderLayer(
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                config.rms_norm_eps,
                options,
            )
            for _ in range(config.num_hidden_layers)
        ]
        self.norm: mx.array | None = None  # [hidden]
        self.lm_head: Weight | None = None  # [vocab, hidden]; None: the embedding serves
        self.rotary = Rotary(config)

    @staticmethod
    def layer_options(config: ModelConfig) -> LayerOptions:
        return LayerOptions()

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        """input_ids/positions int32 [T] -> pre-norm hidden states [T, hidden]."""
        assert self.embed is not None
        x = take_rows(self.embed, input_ids)  # [T, hidden]
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, self.rotary, positions, meta, cache)
        return x

    def logits(self, hidden: mx.array) -> mx.array:
        """hidden [N, hidden] (pre-norm) -> logits [N, vocab] in the compute dtype."""
        head = self.lm_head if self.lm_head is not None else self.embed
        assert head is not None
        return linear(mx.fast.rms_norm(hidden, self.norm, self.config.rms_norm_eps), head)
