"""Gemma 2 and Gemma 3 (text): Llama's attention and a gated MLP, with Gemma's own details.

- the embedding is scaled by sqrt(hidden) (in the compute dtype, as transformers rounds it);
- RMSNorm multiplies by (1 + weight): the loader adds the 1 once (`after_load`);
- norms before and after both attention and MLP; the MLP is GeGLU (gelu, tanh approximation);
- scores scaled by query_pre_attn_scalar ** -0.5 and, in Gemma 2, soft-capped; logits soft-capped;
- layers alternate sliding-window and global attention (`layer_types`);
- Gemma 3: q/k RMSNorm before RoPE, and a second RoPE base (`rope_local_base_freq`) for sliding layers.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from localchat.backends.torch.attention import AttentionOptions, rope_paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import Rotary, empty_param, rms_norm
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.quant import linear
from localchat.weights.config import ModelConfig


def is_sliding(config: ModelConfig, index: int) -> bool:
    return config.extra["layer_types"][index] == "sliding_attention"


class GemmaLayer(PartialSums):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        h, kvh, d, hidden = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.hidden_size,
        )
        self.heads, self.kv_heads, self.head_dim, self.eps = h, kvh, d, config.rms_norm_eps
        self.sliding = is_sliding(config, index)
        self.attn_options = AttentionOptions(
            window=config.sliding_window if self.sliding else None,
            softcap=config.extra["attn_logit_softcapping"],
            scale=float(config.extra["query_pre_attn_scalar"] or d) ** -0.5,
            pictures_both_ways=True,  # Gemma 3: each picture's tokens see all of it (Gemma 2 has none)
        )
        self.attn_norm = empty_param(hidden)
        self.qkv = empty_param((h + 2 * kvh) * d, hidden)
        self.o = empty_param(hidden, h * d)
        self.post_attn_norm = empty_param(hidden)
        self.mlp_norm = empty_param(hidden)
        self.gate_up = empty_param(2 * config.intermediate_size, hidden)
        self.down = empty_param(hidden, config.intermediate_size)
        self.post_mlp_norm = empty_param(hidden)
        # Gemma 3: q_norm per q head then k_norm per k head, fused by the loader (see qwen3.py).
        self.qk_norm = empty_param(h + kvh, d) if config.extra["qk_norm"] else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        h, kvh, d, eps = self.heads, self.kv_heads, self.head_dim, self.eps
        qkv = linear(rms_norm(x, self.attn_norm, eps), self.qkv).view(tokens, h + 2 * kvh, d)
        qk = qkv[:, : h + kvh]
        if self.qk_norm is not None:
            qk = rms_norm(qk, None, eps) * self.qk_norm
        attn = rope_paged_attention(qk, qkv[:, h + kvh :], cos, sin, kv_cache, meta, self.attn_options)
        # The post norms need the whole vector: the row-parallel sums come before them.
        attn_out = self.reduce_partial(linear(attn.reshape(tokens, h * d), self.o))
        x = x + rms_norm(attn_out, self.post_attn_norm, eps)
        gate_up = linear(rms_norm(x, self.mlp_norm, eps), self.gate_up)
        inter = gate_up.shape[-1] // 2
        act = F.gelu(gate_up[:, :inter], approximate="tanh") * gate_up[:, inter:]
        return x + rms_norm(self.reduce_partial(linear(act, self.down)), self.post_mlp_norm, eps)


class Model(DecoderLM):
    layer_class = GemmaLayer
    # Image embeddings for the next forward: (rows of this step's flattened tokens, values [rows, hidden]).
    # They replace those rows' token embeddings after the sqrt(hidden) scale, as transformers scatters them.
    image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None
    # transformers' Gemma 3 (token_type_ids, as its processor gives them): a picture's tokens attend to
    # each other both ways on every layer; the runner and the scheduler read this
    pictures_both_ways = True

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        local_theta = config.extra["rope_local_base_freq"]
        # Gemma 3's sliding layers turn at their own base, unscaled; Gemma 2 has one RoPE.
        self.local_rotary = (
            Rotary(replace(config, rope_theta=float(local_theta), rope_scaling=None), device)
            if local_theta is not None
            else None
        )
        self.final_softcap: float | None = config.extra["final_logit_softcapping"]

    def after_load(self) -> None:
        """Gemma's RMSNorm scales by (1 + weight): fold the 1 in once."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.split(".")[-1].endswith("norm"):
                    param.add_(1.0)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed_tokens(input_ids)
        return x * torch.tensor(math.sqrt(self.config.hidden_size), dtype=x.dtype)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            x = x.index_copy(0, rows, values.to(x.dtype))
        global_rope = self.rotary(positions, x.dtype)
        local_rope = global_rope if self.local_rotary is None else self.local_rotary(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            cos, sin = local_rope if layer.sliding else global_rope
            x = layer.forward(x, cos, sin, meta, kv_cache)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().logits(hidden)
        cap = self.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
