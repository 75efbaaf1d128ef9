"""Gemma 4 (dense text model). Sizes, RoPE tables, KV sharing and what differs from Gemma 3:
localchat/arch/gemma4.py.

Layer: x + post_attn_norm(o(attention)) over attn_norm(x); then x + post_mlp_norm(GeGLU) over
mlp_norm(x); the result times `layer_scalar`. Attention: q -> RMSNorm * q_weight -> RoPE; k likewise;
v -> RMSNorm (no weight); unscaled scores. A global layer with `attention_k_eq_v` has no v_proj: its
values are k_proj's output (before k's norm and RoPE).

The cache is the widest head size and the largest KV head count of any layer: q, k, v are zero-padded
to it and KV heads repeated, the output sliced back. q carries sqrt(cache width) so the cache-width
score scale of `paged_attention` comes out as 1. Layers that share KV write the keys and values of their
source layer (the same values at the same slots) into its cache and attend there.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from localchat.arch.gemma4 import FULL, inv_freq, kv_sources
from localchat.backends.torch.attention import AttentionOptions, paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import apply_rope, empty_param, rms_norm
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.moe import Expert
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.quant import embed_rows, linear
from localchat.weights.config import ModelConfig

Shared = dict[int, tuple[torch.Tensor, torch.Tensor]]  # source layer -> this step's cache-shaped k, v


class Gemma4Moe(nn.Module):
    """The MoE block beside the dense MLP: the router sees the RMS-normed input times `router_scale` and
    hidden ** -0.5; softmax, top-k renormalised, times each chosen expert's `expert_scale`; the experts
    (GeGLU) see the input through their own norm. The layer applies `post_norm` to the weighted sum."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        x, hidden = config.extra, config.hidden_size
        experts, size = int(x["num_experts"]), int(x["moe_intermediate_size"])
        self.top_k, self.eps, self.scale = int(x["top_k_experts"]), config.rms_norm_eps, hidden**-0.5
        self.router = empty_param(experts, hidden)
        self.router_scale = empty_param(hidden)
        self.expert_scale = empty_param(experts)
        self.pre_norm = empty_param(hidden)
        self.post_norm = empty_param(hidden)
        self.experts = nn.ModuleList(Expert(hidden, size) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden]: the layer's residual stream after attention -> the experts' weighted sum, before
        the block's post norm (under --tp each rank's experts are cut by width: a partial sum)."""
        scores = linear(rms_norm(x, None, self.eps) * self.router_scale * self.scale, self.router)
        weights, ids = scores.float().softmax(dim=-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.expert_scale.float()[ids]
        normed = rms_norm(x, self.pre_norm, self.eps)
        out = torch.zeros_like(x)
        experts = cast(list[Expert], list(self.experts))
        for e in ids.unique().tolist():  # NOTE: a host sync per layer, as in moe.py
            rows, slot = (ids == e).nonzero(as_tuple=True)
            gate_up = linear(normed[rows], experts[e].gate_up)
            inter = gate_up.shape[-1] // 2
            act = F.gelu(gate_up[:, :inter], approximate="tanh") * gate_up[:, inter:]
            out.index_add_(0, rows, linear(act, experts[e].down) * weights[rows, slot, None].to(x.dtype))
        return out


class Gemma4Layer(PartialSums):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        x = config.extra
        self.kind = x["layer_types"][index]
        self.index, self.source = index, kv_sources(config)[index]
        h, hidden = config.num_attention_heads, config.hidden_size
        d, kvh = x["layer_head_dims"][index], x["layer_kv_heads"][index]
        self.heads, self.kv_heads, self.head_dim, self.eps = h, kvh, d, config.rms_norm_eps
        self.width, self.repeat = config.head_dim, config.num_key_value_heads // kvh
        self.q_scale = math.sqrt(config.head_dim)
        window = config.sliding_window if self.kind != FULL else None
        # use_bidirectional_attention "vision": a picture's tokens see all of it, on sliding layers only
        both_ways = x.get("use_bidirectional_attention") == "vision"
        self.attn_options = AttentionOptions(window=window, pictures_both_ways=both_ways) if window else None
        self.attn_norm = empty_param(hidden)
        self.q = empty_param(h * d, hidden)
        self.q_weight = empty_param(d)
        owns_kv = self.source == index
        shares_values = bool(x.get("attention_k_eq_v")) and self.kind == FULL
        self.k = empty_param(kvh * d, hidden) if owns_kv else None
        self.k_weight = empty_param(d) if owns_kv else None
        self.v = empty_param(kvh * d, hidden) if owns_kv and not shares_values else None
        self.o = empty_param(hidden, h * d)
        self.post_attn_norm = empty_param(hidden)
        self.mlp_norm = empty_param(hidden)
        # `use_double_wide_mlp`: the KV-sharing layers' MLP is twice as wide.
        inter = config.intermediate_size * (2 if x.get("use_double_wide_mlp") and not owns_kv else 1)
        self.gate_up = empty_param(2 * inter, hidden)
        self.down = empty_param(hidden, inter)
        self.post_mlp_norm = empty_param(hidden)
        self.layer_scalar = empty_param(1)
        self.moe = Gemma4Moe(config) if x.get("enable_moe_block") else None
        self.mlp_post_norm = empty_param(hidden) if self.moe is not None else None
        ple = int(x.get("hidden_size_per_layer_input") or 0)  # per-layer embeddings (E2B / E4B)
        self.ple_gate = empty_param(ple, hidden) if ple else None
        self.ple_proj = empty_param(hidden, ple) if ple else None
        self.ple_post_norm = empty_param(hidden) if ple else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
        shared: Shared | None = None,
        ple: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`shared`: this step's keys and values by source layer; `ple` [T, ple]: this layer's slice of
        the per-layer embeddings."""
        tokens, eps = x.shape[0], self.eps
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        normed = rms_norm(x, self.attn_norm, eps)
        q = rms_norm(linear(normed, self.q).view(tokens, h, d), self.q_weight, eps)
        q = self._pad(apply_rope(q, cos, sin)) * self.q_scale
        if self.k is not None:
            raw_k = linear(normed, self.k).view(tokens, kvh, d)
            raw_v = raw_k if self.v is None else linear(normed, self.v).view(tokens, kvh, d)
            k = apply_rope(rms_norm(raw_k, self.k_weight, eps), cos, sin)
            k, v = self._to_cache(k), self._to_cache(rms_norm(raw_v, None, eps))
            if shared is not None:
                shared[self.index] = k, v
        else:
            assert shared is not None, "a KV-sharing layer needs its source layer's keys and values"
            k, v = shared[self.source]
        attn = paged_attention(q, k, v, kv_cache, meta, self.attn_options)[..., :d]
        # The post norms need the whole vector: the row-parallel sums come before them.
        attn_out = self.reduce_partial(linear(attn.reshape(tokens, h * d), self.o))
        x = x + rms_norm(attn_out, self.post_attn_norm, eps)
        gate_up = linear(rms_norm(x, self.mlp_norm, eps), self.gate_up)
        inter = gate_up.shape[-1] // 2
        act = F.gelu(gate_up[:, :inter], approximate="tanh") * gate_up[:, inter:]
        mlp = self.reduce_partial(linear(act, self.down))
        if self.moe is not None:  # 26B-A4B: the dense MLP's output normed, plus the MoE block's
            # (normed apart: under --tp each is summed before its own norm)
            moe = rms_norm(self.reduce_partial(self.moe.forward(x)), self.moe.post_norm, eps)
            mlp = rms_norm(mlp, self.mlp_post_norm, eps) + moe
        x = x + rms_norm(mlp, self.post_mlp_norm, eps)
        if ple is not None:
            assert self.ple_gate is not None and self.ple_proj is not None
            gate = F.gelu(linear(x, self.ple_gate), approximate="tanh") * ple
            x = x + rms_norm(linear(gate, self.ple_proj), self.ple_post_norm, eps)
        return x * self.layer_scalar

    def _pad(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.shape[-1] == self.width else F.pad(t, (0, self.width - t.shape[-1]))

    def _to_cache(self, t: torch.Tensor) -> torch.Tensor:
        """[T, kv_heads, d] -> [T, cache kv heads, cache width]: zero-padded, heads repeated (GQA groups
        stay the same: query head i still reads its own KV head)."""
        t = self._pad(t)
        return t if self.repeat == 1 else t.repeat_interleave(self.repeat, dim=1)


class Model(DecoderLM):
    layer_class = Gemma4Layer
    # Image embeddings for the next forward (the runner sets them): (rows of this step's flattened tokens,
    # values [rows, hidden]), scattered over the scaled token embeddings as transformers does.
    image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None
    # A later pipeline stage's step (its pictures' embeddings were made on the first): the rows under a
    # picture, which take the pad token's per-layer embeddings there too.
    picture_rows: torch.Tensor | None = None

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        x = config.extra
        self.pictures_both_ways = x.get("use_bidirectional_attention") == "vision"  # the runner reads it
        # One RoPE table per layer type, at that type's head size.
        self.inv_freqs: dict[str, torch.Tensor] = {}
        for kind, d in zip(x["layer_types"], x["layer_head_dims"], strict=True):
            if kind not in self.inv_freqs:
                self.inv_freqs[kind] = torch.from_numpy(inv_freq(config, kind, d)).to(device)
        sources = kv_sources(config)
        owners = sorted(set(sources))
        self.num_kv_layers = len(owners)  # the runner allocates one cache per layer that owns K/V
        self.cache_index = [owners.index(s) for s in sources]
        self.final_softcap: float | None = x["final_logit_softcapping"]
        self.capturable = not x.get("enable_moe_block")  # expert dispatch syncs with the host
        self.ple_width = int(x.get("hidden_size_per_layer_input") or 0)
        if self.ple_width:
            layers_width = config.num_hidden_layers * self.ple_width
            self.ple_embed = empty_param(int(x["vocab_size_per_layer_input"]), layers_width)
            self.ple_projection = empty_param(layers_width, config.hidden_size)
            self.ple_norm = empty_param(self.ple_width)

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
        images = self.image_embeds
        pictures = images[0] if images is not None else self.picture_rows
        if pictures is not None:  # the pad token under each picture (its id may be outside the vocabulary)
            input_ids = input_ids.index_fill(0, pictures, int(self.config.extra["pad_token_id"]))
        x, source = self.embed_inputs(input_ids)
        tables = {kind: _cos_sin(positions, f, x.dtype) for kind, f in self.inv_freqs.items()}
        # Per-layer embeddings: the pad token's table row under a picture, the projection of its embedding.
        ple = self.per_layer_inputs(input_ids, source) if self.ple_width else None
        shared: Shared = {}
        kinds = self.config.extra["layer_types"]
        for i, (layer, kind, cache) in enumerate(zip(self.layers, kinds, self.cache_index, strict=True)):
            cos, sin = tables[kind]
            x = layer.forward(x, cos, sin, meta, kv_caches[cache], shared, None if ple is None else ple[:, i])
        return x

    def embed_inputs(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the layers' input, what the per-layer inputs project): both the scaled token embeddings with
        the pictures' rows written over them (a pipeline stage after the first receives them instead)."""
        x = self.embed_tokens(input_ids)
        images = self.image_embeds
        if images is not None:
            x = x.index_copy(0, images[0], images[1].to(x.dtype))
        return x, x

    def per_layer_inputs(self, input_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """[T, layers, ple]: each token's row of the per-layer table (scaled by sqrt(ple)) plus the
        RMS-normed projection of its (scaled) embedding, over sqrt(2), as transformers combines them."""
        tokens, width = x.shape[0], self.ple_width
        table = embed_rows(input_ids, self.ple_embed, x.dtype)
        table = table * torch.tensor(math.sqrt(width), dtype=x.dtype)
        projected = linear(x, self.ple_projection) * (self.config.hidden_size**-0.5)
        projected = rms_norm(projected.view(tokens, -1, width), self.ple_norm, self.config.rms_norm_eps)
        return (projected + table.view(tokens, -1, width)) * (2.0**-0.5)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().logits(hidden)
        cap = self.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


def _cos_sin(
    positions: torch.Tensor, inv: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, head_dim] in `apply_rope`'s rotate-half form (layers.Rotary's, for a given table)."""
    freqs = positions.float()[:, None] * inv[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    return (
        torch.cat((cos, cos), dim=-1)[:, None, :].to(dtype),
        torch.cat((-sin, sin), dim=-1)[:, None, :].to(dtype),
    )
