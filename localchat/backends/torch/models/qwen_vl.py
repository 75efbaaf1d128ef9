"""The text side of Qwen2.5-VL / Qwen3-VL: the Qwen2 / Qwen3 decoder with M-RoPE (backends/torch/mrope.py)
and image embeddings written over the placeholder tokens' embeddings. Qwen3-VL's DeepStack rows (the
tower's middle layers, concatenated after the main rows) are added to the hidden states of the image
tokens after each of the first layers, as transformers does."""

from __future__ import annotations

import torch

from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.mrope import MRotary
from localchat.weights.config import ModelConfig


class VisionLanguage(DecoderLM):
    # Image embeddings for the next forward: (rows of this step's flattened tokens, values
    # [rows, hidden * (1 + DeepStack layers)]); set and cleared by the runner around one step.
    image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        if config.extra.get("mrope_section"):
            self.rotary = MRotary(config, device)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        if self.image_embeds is None:  # no image rows (decode after a picture too): the plain (fused) path,
            return super().hidden_states(input_ids, positions, meta, kv_caches)  # MRotary takes [3, T]
        x = self.embed_tokens(input_ids)
        stacked: list[torch.Tensor] = []
        rows: torch.Tensor | None = None
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            blocks = values.to(x.dtype).split(self.config.hidden_size, dim=-1)
            x = x.index_copy(0, rows, blocks[0])
            stacked = list(blocks[1:])
        cos, sin = self.rotary(positions, x.dtype)
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x = layer.forward(x, cos, sin, meta, kv_cache)
            if index < len(stacked) and rows is not None:
                x = x.index_add(0, rows, stacked[index])
        return x
