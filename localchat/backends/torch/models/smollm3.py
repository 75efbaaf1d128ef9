"""SmolLM3 (3B): Llama's layer, except that every `no_rope_layer_interval`-th layer (config
`no_rope_layers[i] == 0`) applies no RoPE at all (NoPE), and, with `use_sliding_window`, only those
NoPE layers slide (`layer_types`).

NoPE layers get cos = 1, sin = 0: the rotation is then exactly the identity, so every attention path
(fused CPU decode, Triton, the torch fallback) runs unchanged.
"""

from __future__ import annotations

import torch

from localchat.arch.llama4 import uses_rope  # the same NoPE rule (no_rope_layers, every 4th by default)
from localchat.backends.torch.attention import AttentionOptions
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class SmolLM3Layer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.rope = uses_rope(config, index)
        types = config.extra.get("layer_types") or []
        sliding = index < len(types) and types[index] == "sliding_attention"
        window = config.sliding_window if sliding else None
        self.attn_options = AttentionOptions(window=window) if window else None


class Model(DecoderLM):
    layer_class = SmolLM3Layer

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        still = torch.ones_like(cos), torch.zeros_like(sin)  # NoPE layers: the identity rotation
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            layer_cos, layer_sin = (cos, sin) if layer.rope else still
            x = layer.forward(x, layer_cos, layer_sin, meta, kv_cache)  # .forward: skip hook dispatch
        return x
