"""Gemma 2 and Gemma 3 (text) on MLX; the torch twin (localchat/backends/torch/models/gemma.py) lists
what differs from Llama. Norm weights get their (1 + weight) folded in once, after loading."""

from __future__ import annotations

import math
from dataclasses import replace

import mlx.core as mx
import mlx.nn

from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import Rotary, project
from localchat.backends.mlx.models.base import DecoderLM, Layer
from localchat.backends.mlx.quant import Weight, linear
from localchat.weights.config import ModelConfig

NORMS = ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm", "q_norm", "k_norm")


class GemmaLayer(Layer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        hidden, inter = config.hidden_size, config.intermediate_size
        self.heads, self.kv_heads, self.head_dim, self.eps = h, kvh, d, config.rms_norm_eps
        self.sliding = config.extra["layer_types"][index] == "sliding_attention"
        self.window = config.sliding_window if self.sliding else None
        self.softcap: float | None = config.extra["attn_logit_softcapping"]
        self.scale = float(config.extra["query_pre_attn_scalar"] or d) ** -0.5
        self.attn_norm: mx.array | None = None
        self.qkv: Weight | list[Weight] | None = None
        self.o: Weight | None = None
        self.post_attn_norm: mx.array | None = None
        self.mlp_norm: mx.array | None = None
        self.gate_up: Weight | list[Weight] | None = None
        self.down: Weight | None = None
        self.post_mlp_norm: mx.array | None = None
        self.q_norm: mx.array | None = None
        self.k_norm: mx.array | None = None
        for name in ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm"):
            self.declare(name, hidden)
        for part, rows in enumerate((h * d, kvh * d, kvh * d)):
            self.declare(f"qkv.{part}", rows, hidden)
        self.declare("o", hidden, h * d)
        self.declare("gate_up.0", inter, hidden)
        self.declare("gate_up.1", inter, hidden)
        self.declare("down", hidden, inter)
        if config.extra["qk_norm"]:  # Gemma 3
            self.declare("q_norm", d)
            self.declare("k_norm", d)

    def __call__(
        self, x: mx.array, rotary: Rotary, positions: mx.array, meta: AttentionMetadata, cache: LayerCache
    ) -> mx.array:
        tokens = x.shape[0]
        h, kvh, d, eps = self.heads, self.kv_heads, self.head_dim, self.eps
        qkv = project(mx.fast.rms_norm(x, self.attn_norm, eps), self.qkv).reshape(tokens, h + 2 * kvh, d)
        q, k = qkv[:, :h], qkv[:, h : h + kvh]
        if self.q_norm is not None:
            q, k = mx.fast.rms_norm(q, self.q_norm, eps), mx.fast.rms_norm(k, self.k_norm, eps)
        q, k = rotary(q, positions), rotary(k, positions)
        # Gemma 3: each picture's tokens see all of it (pictures=True; Gemma 2 has none)
        attn = paged_attention(
            q, k, qkv[:, h + kvh :], cache, meta, self.scale, self.window, self.softcap, pictures=True
        )
        assert self.o is not None and self.down is not None
        x = x + mx.fast.rms_norm(linear(attn.reshape(tokens, h * d), self.o), self.post_attn_norm, eps)
        gate, up = mx.split(project(mx.fast.rms_norm(x, self.mlp_norm, eps), self.gate_up), 2, axis=-1)
        act = mlx.nn.gelu_approx(gate) * up
        return x + mx.fast.rms_norm(linear(act, self.down), self.post_mlp_norm, eps)


class Model(DecoderLM):
    layer_class = GemmaLayer
    # Image embeddings for the next forward: (rows of this step's flattened tokens, values [rows, hidden]).
    # They replace those rows' token embeddings after the sqrt(hidden) scale, as transformers scatters them.
    image_embeds: tuple[mx.array, mx.array] | None = None
    # transformers' Gemma 3 (token_type_ids, as its processor gives them): a picture's tokens attend to
    # each other both ways on every layer; the runner and the scheduler read this
    pictures_both_ways = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        local_theta = config.extra["rope_local_base_freq"]
        # Gemma 3's sliding layers turn at their own base, unscaled; Gemma 2 has one RoPE.
        self.local_rotary = (
            Rotary(replace(config, rope_theta=float(local_theta), rope_scaling=None))
            if local_theta is not None
            else self.rotary
        )
        self.final_softcap: float | None = config.extra["final_logit_softcapping"]

    def after_load(self) -> None:
        """Gemma's RMSNorm scales by (1 + weight): fold the 1 in once."""
        assert self.norm is not None
        self.norm = self.norm + 1.0
        for layer in self.layers:
            for name in NORMS:
                weight = getattr(layer, name)
                if weight is not None:
                    setattr(layer, name, weight + 1.0)
        mx.eval(
            self.norm, *[w for layer in self.layers for n in NORMS if (w := getattr(layer, n)) is not None]
        )

    def embed_tokens(self, input_ids: mx.array) -> mx.array:
        x = super().embed_tokens(input_ids)
        return x * mx.array(math.sqrt(self.config.hidden_size), dtype=x.dtype)

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            x[rows] = values.astype(x.dtype)
        for layer, cache in zip(self.layers, caches, strict=True):
            assert isinstance(layer, GemmaLayer)
            x = layer(x, self.local_rotary if layer.sliding else self.rotary, positions, meta, cache)
        return x

    def logits(self, hidden: mx.array) -> mx.array:
        logits = super().logits(hidden)
        cap = self.final_softcap
        return logits if cap is None else mx.tanh(logits / cap) * cap
