"""Ministral 3 (3B / 8B / 14B): Mistral's layer, plus Llama 4's attention temperature: after RoPE, q is
scaled per token by 1 + beta * log(1 + floor(position / original length)) (localchat/arch/rope.py).

The model computes that scale once per step from the positions, like cos/sin, and hands it to each
layer; without a beta in the config it runs the base step unchanged.
"""

from __future__ import annotations

import torch

from localchat.arch.rope import attention_temperature
from localchat.backends.torch.attention import paged_attention
from localchat.backends.torch.layers import apply_rope, rms_norm
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.quant import linear
from localchat.weights.config import ModelConfig


class Ministral3Layer(LlamaLayer):
    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_cache: torch.Tensor,
        q_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Llama's layer with q [T, h, d] times `q_scale` [T, 1, 1] after RoPE (None: unscaled)."""
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = linear(rms_norm(x, self.attn_norm, self.eps), self.qkv, self.qkv_bias).view(
            tokens, h + 2 * kvh, d
        )
        qk = apply_rope(self.normalize_qk(qkv[:, : h + kvh]), cos, sin)  # [T, h + kvh, d]
        q = qk[:, :h] if q_scale is None else qk[:, :h] * q_scale
        attn = paged_attention(q, qk[:, h:], qkv[:, h + kvh :], kv_cache, meta, self.attn_options)
        x = x + linear(attn.reshape(tokens, h * d), self.o, self.o_bias)
        return x + self.mlp(rms_norm(x, self.mlp_norm, self.eps))


class Model(DecoderLM):
    layer_class = Ministral3Layer

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        self.temperature = attention_temperature(config)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        if self.temperature is None:
            return super().hidden_states(input_ids, positions, meta, kv_caches)
        beta, length = self.temperature
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        # In float32 from the integer positions, then cast, as transformers does.
        scale = 1 + beta * torch.log(1 + torch.floor(positions.float() / length))
        q_scale = scale.to(x.dtype)[:, None, None]  # [T, 1, 1]
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, cos, sin, meta, kv_cache, q_scale)  # .forward: skip hook dispatch
        return x
