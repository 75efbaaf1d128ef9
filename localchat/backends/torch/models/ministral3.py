"""Ministral 3 (3B / 8B / 14B): Mistral's layer, plus Llama 4's attention temperature: after RoPE, q is
scaled per token by 1 + beta * log(1 + floor(position / original length)) (localchat/arch/rope.py).

The model computes that scale once per step from the positions, like cos/sin, and hands it to each
layer; without a beta in the config it runs the base step unchanged.
"""

from __future__ import annotations

import torch

from localchat.arch.rope import attention_temperature
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class Model(DecoderLM):
    layer_class = LlamaLayer  # its forward takes the q scale
    # Image rows for the next forward (a Mistral3ForConditionalGeneration wrapper's pictures): (rows of
    # this step's flattened tokens, values [rows, hidden]); set and cleared by the runner around one step.
    image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        self.temperature = attention_temperature(config)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        if self.temperature is None and self.image_embeds is None:
            return super().hidden_states(input_ids, positions, meta, kv_caches)
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:  # the pictures' rows over their [IMG] placeholders
            rows, values = self.image_embeds
            x = x.index_copy(0, rows, values.to(x.dtype))
        cos, sin = self.rotary(positions, x.dtype)
        q_scale = None
        if self.temperature is not None:
            beta, length = self.temperature
            # In float32 from the integer positions, then cast, as transformers does.
            scale = 1 + beta * torch.log(1 + torch.floor(positions.float() / length))
            q_scale = scale.to(x.dtype)[:, None, None]  # [T, 1, 1]
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, cos, sin, meta, kv_cache, q_scale)  # .forward: skip hook dispatch
        return x
