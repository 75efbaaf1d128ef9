"""Llama 2 / 3 / 3.1 / 3.2 and the checkpoints sharing its layout: Mistral (7B, Nemo), Qwen2 / Qwen2.5
(q/k/v bias), SmolLM2, Yi, DeepSeek-R1-Distill-Llama.

Layer: x + o(attention(rope(q, k), v)) over RMSNorm(x), then x + down(silu(gate) * up) over RMSNorm(x).
"""

from __future__ import annotations

import mlx.core as mx

from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import Rotary, project, silu
from localchat.backends.mlx.models.base import Layer
from localchat.backends.mlx.models.qwen_vl import VisionLanguage
from localchat.backends.mlx.quant import Weight, linear
from localchat.weights.config import ModelConfig


class LlamaLayer(Layer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        hidden, inter = config.hidden_size, config.intermediate_size
        self.heads, self.kv_heads, self.head_dim, self.eps = h, kvh, d, config.rms_norm_eps
        self.scale = d**-0.5
        self.window = config.sliding_window  # Mistral's, on every layer; None: full attention
        # Filled by the loader; optional ones stay None unless declared below.
        self.attn_norm: mx.array | None = None
        self.qkv: Weight | list[Weight] | None = None  # parts stay a list when their formats differ
        self.qkv_bias: mx.array | None = None
        self.o: Weight | None = None
        self.o_bias: mx.array | None = None
        self.mlp_norm: mx.array | None = None
        self.gate_up: Weight | list[Weight] | None = None
        self.down: Weight | None = None
        self.declare("attn_norm", hidden)
        for part, rows in enumerate((h * d, kvh * d, kvh * d)):
            self.declare(f"qkv.{part}", rows, hidden)  # fused at load when the formats agree
            if config.attention_bias:  # Llama: on q, k, v and o; Qwen2: q, k, v only (registry)
                self.declare(f"qkv_bias.{part}", rows)
        self.declare("o", hidden, h * d)
        if config.extra.get("o_bias", config.attention_bias):
            self.declare("o_bias", hidden)
        self.declare("mlp_norm", hidden)
        self.declare("gate_up.0", inter, hidden)
        self.declare("gate_up.1", inter, hidden)
        self.declare("down", hidden, inter)

    def __call__(
        self,
        x: mx.array,
        rotary: Rotary,
        positions: mx.array,
        meta: AttentionMetadata,
        cache: LayerCache,
        q_scale: mx.array | None = None,
    ) -> mx.array:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        normed = mx.fast.rms_norm(x, self.attn_norm, self.eps)
        qkv = project(normed, self.qkv, self.qkv_bias).reshape(tokens, h + 2 * kvh, d)
        q, k = self.normalize_qk(qkv[:, :h], qkv[:, h : h + kvh])
        q, k = rotary(q, positions), rotary(k, positions)
        if q_scale is not None:  # Ministral 3's position-dependent temperature, [T, 1, 1]
            q = q * q_scale
        attn = paged_attention(q, k, qkv[:, h + kvh :], cache, meta, self.scale, self.window)  # [T, h, d]
        assert self.o is not None
        x = x + linear(attn.reshape(tokens, h * d), self.o, self.o_bias)
        return x + self.mlp(mx.fast.rms_norm(x, self.mlp_norm, self.eps))

    def mlp(self, x: mx.array) -> mx.array:
        """The feed-forward block on normed x [T, hidden]: SwiGLU in Llama."""
        assert self.down is not None
        gate, up = mx.split(project(x, self.gate_up), 2, axis=-1)
        return linear(silu(gate) * up, self.down)

    def normalize_qk(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        """q [T, h, d] and k [T, kvh, d] before RoPE: unchanged in Llama."""
        return q, k


class Model(VisionLanguage):
    """Also the text model of LLaVA-style checkpoints and GGUFs: image rows written over the placeholder
    tokens' embeddings when a step carries any (VisionLanguage)."""

    layer_class = LlamaLayer
