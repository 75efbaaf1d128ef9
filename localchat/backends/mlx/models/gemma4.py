"""Gemma 4 (text models) on MLX. Sizes, RoPE tables, KV sharing and what differs from Gemma 3:
localchat/arch/gemma4.py; the torch twin (localchat/backends/torch/models/gemma4.py) has the same steps.

Layer: x + post_attn_norm(o(attention)) over attn_norm(x); then x + post_mlp_norm(GeGLU) over
mlp_norm(x) (26B-A4B: the dense MLP's output normed, plus the MoE block's); E2B / E4B then add the gated
per-layer embedding; the result times `layer_scalar`. Attention: q -> RMSNorm * q_weight -> RoPE; k
likewise; v -> RMSNorm without weight; unscaled scores (scale 1). A global layer with `attention_k_eq_v`
has no v_proj: its values are k_proj's output (before k's norm and RoPE).

The cache holds every layer at the widest head size and the largest KV head count: q, k, v are
zero-padded to that width and KV heads repeated (zeros add nothing to q.k; the padded value dims are
sliced off after attention). Layers sharing another layer's K/V write that layer's keys and values (the
same values at the same slots) into its cache and attend there.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn
import numpy as np

from localchat.arch.gemma4 import FULL, inv_freq, kv_sources
from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import Rotary, project
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.moe import SparseMoe, WithMoe, _gather
from localchat.backends.mlx.quant import Embedding, Weight, linear, take_rows
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig

Shared = dict[int, tuple[mx.array, mx.array]]  # source layer -> this step's cache-shaped k, v
PLE_ARRAYS = ("ple_embed", "ple_projection", "ple_norm")


class TableRotary(Rotary):
    """Rotate-half RoPE over the whole head from a given inverse-frequency table (zeros: dims that stay
    still, Gemma 4's proportional RoPE on the global layers)."""

    def __init__(self, inv: np.ndarray) -> None:  # no config: the table is the layer type's
        # A still pair gets the largest finite period (angle ~1e-39 x position, i.e. 0): no inf reaches
        # the kernel, whose fast math need not honour it.
        still = np.float64(np.finfo(np.float32).max)
        periods = 1.0 / np.where(inv > 0, inv, 1.0).astype(np.float64)
        self.periods = mx.array(np.where(inv > 0, periods, still), dtype=mx.float32)
        self.dims, self.scale, self.long = 2 * len(inv), 1.0, None


class Gemma4Moe(SparseMoe):
    """The MoE block beside the dense MLP: the router sees the RMS-normed input times `router_scale` and
    hidden ** -0.5; softmax, top-k renormalised, times each chosen expert's `expert_scale`; the GeGLU
    experts see the input through their own norm; the sum is normed again."""

    def __init__(self, config: ModelConfig) -> None:
        x, hidden = config.extra, config.hidden_size
        experts, size = int(x["num_experts"]), int(x["moe_intermediate_size"])
        super().__init__(MoeSpec(experts, int(x["top_k_experts"]), True, size, frozenset()), hidden)
        self.eps, self.scale = config.rms_norm_eps, hidden**-0.5
        self.router_scale: mx.array | None = None
        self.expert_scale: mx.array | None = None
        self.pre_norm: mx.array | None = None
        self.post_norm: mx.array | None = None
        self.declare("router_scale", hidden)
        self.declare("expert_scale", experts)
        self.declare("pre_norm", hidden)
        self.declare("post_norm", hidden)

    def forward(self, x: mx.array) -> mx.array:
        """x [T, hidden]: the residual stream after attention -> the block's normed output."""
        assert self.router is not None and self.router_scale is not None and self.expert_scale is not None
        assert self.gate_up is not None and self.down is not None
        scores = linear(mx.fast.rms_norm(x, None, self.eps) * self.router_scale * self.scale, self.router)
        probs = mx.softmax(scores.astype(mx.float32), axis=-1)
        ids = mx.argpartition(-probs, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        weights = mx.take_along_axis(probs, ids, axis=-1)
        weights = weights / weights.sum(axis=-1, keepdims=True) * self.expert_scale.astype(mx.float32)[ids]
        rows = mx.fast.rms_norm(x, self.pre_norm, self.eps)[:, None, None, :]  # [T, 1, 1, hidden]
        gate, up = mx.split(_gather(rows, self.gate_up, ids), 2, axis=-1)  # [T, k, 1, size] each
        out = _gather(mlx.nn.gelu_approx(gate) * up, self.down, ids)[:, :, 0, :]  # [T, k, hidden]
        out = (out * weights.astype(x.dtype)[..., None]).sum(axis=1)
        return mx.fast.rms_norm(out, self.post_norm, self.eps)


class Gemma4Layer(WithMoe):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        x = config.extra
        self.kind: str = x["layer_types"][index]
        self.index, self.source = index, kv_sources(config)[index]
        h, hidden = config.num_attention_heads, config.hidden_size
        d, kvh = x["layer_head_dims"][index], x["layer_kv_heads"][index]
        self.heads, self.kv_heads, self.head_dim, self.eps = h, kvh, d, config.rms_norm_eps
        self.width, self.repeat = config.head_dim, config.num_key_value_heads // kvh
        self.window = config.sliding_window if self.kind != FULL else None
        # use_bidirectional_attention "vision": a picture's tokens see all of it, on sliding layers only
        self.pictures = self.window is not None and x.get("use_bidirectional_attention") == "vision"
        owns_kv = self.source == index
        shares_values = bool(x.get("attention_k_eq_v")) and self.kind == FULL
        # `use_double_wide_mlp`: the KV-sharing layers' MLP is twice as wide.
        inter = config.intermediate_size * (2 if x.get("use_double_wide_mlp") and not owns_kv else 1)
        ple = int(x.get("hidden_size_per_layer_input") or 0)  # per-layer embeddings (E2B / E4B)
        self.attn_norm: mx.array | None = None
        self.q: Weight | None = None
        self.q_weight: mx.array | None = None
        self.k: Weight | None = None
        self.k_weight: mx.array | None = None
        self.v: Weight | None = None
        self.o: Weight | None = None
        self.post_attn_norm: mx.array | None = None
        self.mlp_norm: mx.array | None = None
        self.gate_up: Weight | list[Weight] | None = None
        self.down: Weight | None = None
        self.post_mlp_norm: mx.array | None = None
        self.layer_scalar: mx.array | None = None
        self.mlp_post_norm: mx.array | None = None
        self.ple_gate: Weight | None = None
        self.ple_proj: Weight | None = None
        self.ple_post_norm: mx.array | None = None
        for name in ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm"):
            self.declare(name, hidden)
        self.declare("q", h * d, hidden)
        self.declare("q_weight", d)
        if owns_kv:
            self.declare("k", kvh * d, hidden)
            self.declare("k_weight", d)
            if not shares_values:
                self.declare("v", kvh * d, hidden)
        self.declare("o", hidden, h * d)
        self.declare("gate_up.0", inter, hidden)
        self.declare("gate_up.1", inter, hidden)
        self.declare("down", hidden, inter)
        self.declare("layer_scalar", 1)
        self.moe = Gemma4Moe(config) if x.get("enable_moe_block") else None
        if self.moe is not None:
            self.declare("mlp_post_norm", hidden)
        if ple:
            self.declare("ple_gate", ple, hidden)
            self.declare("ple_proj", hidden, ple)
            self.declare("ple_post_norm", hidden)

    def __call__(  # type: ignore[override]
        self,
        x: mx.array,
        rotary: Rotary,
        positions: mx.array,
        meta: AttentionMetadata,
        cache: LayerCache,
        shared: Shared,
        ple: mx.array | None = None,
    ) -> mx.array:
        """`shared`: this step's keys and values by source layer; `ple` [T, ple]: this layer's slice of
        the per-layer embeddings."""
        tokens, eps = x.shape[0], self.eps
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        assert self.q is not None and self.o is not None and self.down is not None
        assert self.layer_scalar is not None
        normed = mx.fast.rms_norm(x, self.attn_norm, eps)
        q = mx.fast.rms_norm(linear(normed, self.q).reshape(tokens, h, d), self.q_weight, eps)
        q = self._pad(rotary(q, positions))
        if self.k is not None:
            raw_k = linear(normed, self.k).reshape(tokens, kvh, d)
            raw_v = raw_k if self.v is None else linear(normed, self.v).reshape(tokens, kvh, d)
            k = rotary(mx.fast.rms_norm(raw_k, self.k_weight, eps), positions)
            k, v = self._to_cache(k), self._to_cache(mx.fast.rms_norm(raw_v, None, eps))
            shared[self.index] = k, v
        else:
            k, v = shared[self.source]
        attn = paged_attention(q, k, v, cache, meta, 1.0, self.window, pictures=self.pictures)[..., :d]
        x = x + mx.fast.rms_norm(linear(attn.reshape(tokens, h * d), self.o), self.post_attn_norm, eps)
        gate, up = mx.split(project(mx.fast.rms_norm(x, self.mlp_norm, eps), self.gate_up), 2, axis=-1)
        mlp = linear(mlx.nn.gelu_approx(gate) * up, self.down)
        if self.moe is not None:  # 26B-A4B: the dense MLP's output normed, plus the MoE block's
            assert isinstance(self.moe, Gemma4Moe)
            mlp = mx.fast.rms_norm(mlp, self.mlp_post_norm, eps) + self.moe.forward(x)
        x = x + mx.fast.rms_norm(mlp, self.post_mlp_norm, eps)
        if ple is not None:
            assert self.ple_gate is not None and self.ple_proj is not None
            gated = mlx.nn.gelu_approx(linear(x, self.ple_gate)) * ple
            x = x + mx.fast.rms_norm(linear(gated, self.ple_proj), self.ple_post_norm, eps)
        return x * self.layer_scalar

    def _pad(self, t: mx.array) -> mx.array:
        if t.shape[-1] == self.width:
            return t
        return mx.pad(t, [(0, 0), (0, 0), (0, self.width - t.shape[-1])])

    def _to_cache(self, t: mx.array) -> mx.array:
        """[T, kv_heads, d] -> [T, cache kv heads, cache width]: zero-padded, each head repeated in
        place, so query head i still reads its own KV head."""
        t = self._pad(t)
        return t if self.repeat == 1 else mx.repeat(t, self.repeat, axis=1)


class Model(DecoderLM):
    layer_class = Gemma4Layer
    token_tables = ("ple_embed",)  # the loader keeps it [vocab, width] for row lookups
    # Image embeddings for the next forward (the runner sets them): (rows of this step's flattened tokens,
    # values [rows, hidden]), scattered over the scaled token embeddings as transformers does.
    image_embeds: tuple[mx.array, mx.array] | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        x = config.extra
        self.pictures_both_ways = x.get("use_bidirectional_attention") == "vision"  # the runner reads it
        # One RoPE table per layer type, at that type's head size.
        self.rotaries: dict[str, Rotary] = {}
        for kind, d in zip(x["layer_types"], x["layer_head_dims"], strict=True):
            if kind not in self.rotaries:
                self.rotaries[kind] = TableRotary(inv_freq(config, kind, d))
        sources = kv_sources(config)
        owners = sorted(set(sources))
        self.num_kv_layers = len(owners)  # the runner allocates one cache per layer that owns K/V
        self.cache_index = [owners.index(s) for s in sources]
        self.final_softcap: float | None = x["final_logit_softcapping"]
        self.ple_width = int(x.get("hidden_size_per_layer_input") or 0)
        self.ple_embed: Embedding | None = None  # [vocab_per_layer, layers * ple]
        self.ple_projection: Weight | None = None  # [layers * ple, hidden]
        self.ple_norm: mx.array | None = None  # [ple]
        self.top_shapes: dict[str, tuple[int, ...]] = {}
        if self.ple_width:
            width = config.num_hidden_layers * self.ple_width
            self.top_shapes = {
                "ple_embed": (int(x["vocab_size_per_layer_input"]), width),
                "ple_projection": (width, config.hidden_size),
                "ple_norm": (self.ple_width,),
            }

    def after_load(self) -> None:
        missing = [name for name in self.top_shapes if getattr(self, name) is None]
        if missing:
            raise ModelLoadError(
                f"The checkpoint lacks weights this Gemma 4 model needs: {', '.join(missing)}."
            )

    def embed_tokens(self, input_ids: mx.array) -> mx.array:
        x = super().embed_tokens(input_ids)
        return x * mx.array(math.sqrt(self.config.hidden_size), dtype=x.dtype)

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        images = self.image_embeds
        if images is not None:  # the pad token under each picture (its id may be outside the vocabulary)
            input_ids = mx.array(input_ids)
            input_ids[images[0]] = int(self.config.extra["pad_token_id"])
        x = self.embed_tokens(input_ids)
        if images is not None:
            x[images[0]] = images[1].astype(x.dtype)
        # Per-layer embeddings: the pad token's table row under a picture, the projection of its embedding.
        ple = self.per_layer_inputs(input_ids, x) if self.ple_width else None
        shared: Shared = {}
        for i, (layer, cache) in enumerate(zip(self.layers, self.cache_index, strict=True)):
            assert isinstance(layer, Gemma4Layer)
            rotary = self.rotaries[layer.kind]
            x = layer(x, rotary, positions, meta, caches[cache], shared, None if ple is None else ple[:, i])
        return x

    def per_layer_inputs(self, input_ids: mx.array, x: mx.array) -> mx.array:
        """[T, layers, ple]: each token's row of the per-layer table (scaled by sqrt(ple)) plus the
        RMS-normed projection of its (scaled) embedding, over sqrt(2), as transformers combines them."""
        assert self.ple_embed is not None and self.ple_projection is not None
        tokens, width = x.shape[0], self.ple_width
        table = take_rows(self.ple_embed, input_ids).astype(x.dtype) * math.sqrt(width)
        projected = linear(x, self.ple_projection) * (self.config.hidden_size**-0.5)
        projected = mx.fast.rms_norm(
            projected.reshape(tokens, -1, width), self.ple_norm, self.config.rms_norm_eps
        )
        return (projected + table.reshape(tokens, -1, width)) * (2.0**-0.5)

    def logits(self, hidden: mx.array) -> mx.array:
        logits = super().logits(hidden)
        cap = self.final_softcap
        return logits if cap is None else mx.tanh(logits / cap) * cap
