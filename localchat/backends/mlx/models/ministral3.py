"""Ministral 3 (3B / 8B / 14B): Mistral's layer, plus Llama 4's attention temperature: after RoPE, q is
scaled per token by 1 + beta * log(1 + floor(position / original length)) (localchat/arch/rope.py).

The model computes that scale once per step from the positions and hands it to each layer; without a
beta in the config it runs the base step unchanged.
"""

from __future__ import annotations

import mlx.core as mx

from localchat.arch.rope import attention_temperature
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class Model(DecoderLM):
    layer_class = LlamaLayer  # its __call__ takes the q scale
    # Image rows for the next forward (a Mistral3ForConditionalGeneration wrapper's pictures): (rows of
    # this step's flattened tokens, values [rows, hidden]); set and cleared by the runner around one step.
    image_embeds: tuple[mx.array, mx.array] | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.temperature = attention_temperature(config)

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        if self.temperature is None and self.image_embeds is None:
            return super().hidden_states(input_ids, positions, meta, caches)
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:  # the pictures' rows over their [IMG] placeholders
            rows, values = self.image_embeds
            x[rows] = values.astype(x.dtype)
        q_scale = None
        if self.temperature is not None:
            beta, length = self.temperature
            # In float32 from the integer positions, then cast, as transformers does.
            scale = 1 + beta * mx.log(1 + mx.floor(positions.astype(mx.float32) / length))
            q_scale = scale.astype(x.dtype)[:, None, None]  # [T, 1, 1]
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, self.rotary, positions, meta, cache, q_scale)  # type: ignore[call-arg]
        return x
