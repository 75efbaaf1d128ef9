"""Llama 2 / 3 / 3.1 / 3.2 and the checkpoints sharing its layout: Mistral (7B, Nemo), Qwen2 / Qwen2.5
(q/k/v bias), SmolLM2, Yi, DeepSeek-R1-Distill-Llama.

Layer: x + o(attention(rope(q, k), v)) over RMSNorm(x), then x + down(silu(gate) * up) over RMSNorm(x).
"""

from __future__ import annotations

import torch
from torch import nn

from localchat.backends.torch.attention import (
    AttentionMetadata,
    AttentionOptions,
    paged_attention,
    rope_paged_attention,
)
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import add_rms_norm, apply_rope, empty_param, rms_norm, swiglu
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.models.qwen_vl import VisionLanguage
from localchat.backends.torch.quant import linear
from localchat.weights.config import ModelConfig


class LlamaLayer(PartialSums):
    # decode_step.plan runs layers of exactly this class as one C call; a subclass changes the layer (q/k
    # norms, scaled queries, experts), so the flag is read from the class's own namespace, not inherited
    # (nor does a tensor-parallel layer, whose `reduce_partial` all-reduces, take the C step).
    FUSED_DECODE = True

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        h, kvh, d, hidden = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.hidden_size,
        )
        self.heads, self.kv_heads, self.head_dim, self.eps = h, kvh, d, config.rms_norm_eps
        # Llama's `attention_bias` covers q, k, v and o; Qwen2's only q, k, v (registry: o_bias False).
        qkv_bias = config.attention_bias
        o_bias = config.extra.get("o_bias", config.attention_bias)
        self.attn_norm = empty_param(hidden)
        self.qkv = empty_param((h + 2 * kvh) * d, hidden)
        self.qkv_bias = empty_param((h + 2 * kvh) * d) if qkv_bias else None
        self.o = empty_param(hidden, h * d)
        self.o_bias = empty_param(hidden) if o_bias else None
        self.mlp_norm = empty_param(hidden)
        self.gate_up: nn.Parameter | None = empty_param(2 * config.intermediate_size, hidden)
        self.down: nn.Parameter | None = empty_param(hidden, config.intermediate_size)
        # Mistral's sliding window (every layer); None keeps the full-attention fast path.
        window = config.sliding_window
        self.attn_options = AttentionOptions(window=window) if window else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        q_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`q_scale` [T, 1, 1]: multiplies q after RoPE (Ministral 3's position-dependent temperature)."""
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = linear(rms_norm(x, self.attn_norm, self.eps), self.qkv, self.qkv_bias).view(
            tokens, h + 2 * kvh, d
        )
        qk, v = self.normalize_qk(qkv[:, : h + kvh]), qkv[:, h + kvh :]  # [T, h + kvh, d], [T, kvh, d]
        if q_scale is None:
            attn = rope_paged_attention(qk, v, cos, sin, kv_cache, meta, self.attn_options)
        else:
            qk = apply_rope(qk, cos, sin)
            attn = paged_attention(qk[:, :h] * q_scale, qk[:, h:], v, kv_cache, meta, self.attn_options)
        # o_bias is zero on ranks other than 0 under --tp (shard_weights.py), so the sum adds it once.
        attn_out = self.reduce_partial(linear(attn.reshape(tokens, h * d), self.o, self.o_bias))
        x, normed = add_rms_norm(x, attn_out, self.mlp_norm, self.eps)
        return x + self.reduce_partial(self.mlp(normed))  # the whole block: an MoE's experts summed once

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward block on normed x [T, hidden]: SwiGLU in Llama."""
        assert self.gate_up is not None and self.down is not None
        return linear(swiglu(linear(x, self.gate_up)), self.down)

    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:
        """q and k heads [T, h + kvh, d] before RoPE: unchanged in Llama."""
        return qk


class Model(VisionLanguage):
    """Also the text model of LLaVA-style checkpoints and GGUFs: image rows scattered over the
    placeholder tokens' embeddings when a step carries any (VisionLanguage); otherwise the plain path."""

    layer_class = LlamaLayer
