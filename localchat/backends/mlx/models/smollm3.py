"""SmolLM3 on MLX: Llama's layer; NoPE layers (every 4th, `no_rope_layers`) skip RoPE, and with
use_sliding_window only those layers slide (see the torch model file)."""

from __future__ import annotations

import mlx.core as mx

from localchat.arch.llama4 import uses_rope
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache
from localchat.backends.mlx.layers import Rotary
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class _Still(Rotary):
    """The identity in Rotary's place, for NoPE layers."""

    def __init__(self) -> None:  # no table to build
        pass

    def __call__(self, x: mx.array, positions: mx.array) -> mx.array:
        return x


class SmolLM3Layer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        types = config.extra.get("layer_types") or []
        sliding = index < len(types) and types[index] == "sliding_attention"
        self.window = config.sliding_window if sliding else None


class Model(DecoderLM):
    layer_class = SmolLM3Layer
    still = _Still()

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.ropes = [uses_rope(config, i) for i in range(config.num_hidden_layers)]

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        x = self.embed_tokens(input_ids)
        for layer, rope, cache in zip(self.layers, self.ropes, caches, strict=True):
            x = layer(x, self.rotary if rope else self.still, positions, meta, cache)
        return x
