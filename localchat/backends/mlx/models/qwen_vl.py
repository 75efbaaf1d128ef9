"""The text side of Qwen2.5-VL / Qwen3-VL on MLX, the twin of localchat/backends/torch/models/qwen_vl.py:
the Qwen2 / Qwen3 decoder with M-RoPE, image rows over the placeholder embeddings, and Qwen3-VL's
DeepStack rows added after each of the first layers."""

from __future__ import annotations

import mlx.core as mx

from localchat.backends.mlx.attention import AttentionMetadata, LayerCache
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.mrope import MRotary
from localchat.weights.config import ModelConfig


class VisionLanguage(DecoderLM):
    # (rows of this step's flattened tokens, values [rows, hidden * (1 + DeepStack layers)]); set and
    # cleared by the runner around one step.
    image_embeds: tuple[mx.array, mx.array] | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.extra.get("mrope_section"):
            self.rotary = MRotary(config)

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        x = self.embed_tokens(input_ids)
        stacked: list[mx.array] = []
        rows: mx.array | None = None
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            hidden = self.config.hidden_size
            blocks = [values[:, i : i + hidden].astype(x.dtype) for i in range(0, values.shape[-1], hidden)]
            x[rows] = blocks[0]
            stacked = blocks[1:]
        for index, (layer, cache) in enumerate(zip(self.layers, caches, strict=True)):
            x = layer(x, self.rotary, positions, meta, cache)
            if index < len(stacked) and rows is not None:
                x[rows] = x[rows] + stacked[index]
        return x
