"""DeepSeek-V2 / V3 on MLX: multi-head latent attention and a shared-expert mixture of experts. The torch
twin (localchat/backends/torch/models/deepseek.py) walks through the layer; sizes, router rules and the
checkpoint layout live in localchat/arch/deepseek.py."""

from __future__ import annotations

import mlx.core as mx

from localchat.arch.deepseek import LATENT_NORM_EPS, MlaSpec, RouterSpec
from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import Rotary, project, silu
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.moe import Expert, SparseMoe, WithMoe
from localchat.backends.mlx.quant import Weight, linear
from localchat.weights.config import ModelConfig


class SharedExpertMoe(SparseMoe):
    """SparseMoe's gathered-matmul dispatch with DeepSeek's router, plus the shared expert."""

    def __init__(self, spec: MoeSpec, router: RouterSpec, hidden: int) -> None:
        super().__init__(spec, hidden)
        self.rule = router
        self.score_bias: mx.array | None = None  # V3: added to the scores for choosing only
        if router.sigmoid:
            self.declare("score_bias", spec.experts)
        self.shared = Expert(hidden, spec.shared_size) if spec.shared_size else None

    def missing(self) -> list[str]:
        shared = [f"shared.{name}" for name in self.shared.missing()] if self.shared is not None else []
        return super().missing() + shared

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        assert self.router is not None
        rule, tokens = self.rule, x.shape[0]
        logits = linear(x.astype(mx.float32), self.router)  # router kept float32 (registry)
        scores = mx.sigmoid(logits) if rule.sigmoid else mx.softmax(logits, axis=-1)
        choice = scores if self.score_bias is None else scores + self.score_bias.astype(mx.float32)
        if rule.groups > 1:
            grouped = choice.reshape(tokens, rule.groups, -1)
            # V3 ranks a group by its two best (biased) scores, V2 by its best one.
            rank = mx.topk(grouped, 2, axis=-1).sum(axis=-1) if rule.sigmoid else grouped.max(axis=-1)
            best = mx.argpartition(-rank, kth=rule.groups_used - 1, axis=-1)[:, : rule.groups_used]
            kept = (mx.arange(rule.groups)[None, None, :] == best[:, :, None]).any(axis=1)  # [T, groups]
            fill = -mx.inf if rule.sigmoid else 0.0  # softmax scores are >= 0: V2 masks with 0
            choice = mx.where(mx.repeat(kept, grouped.shape[-1], axis=1), choice, fill)
        ids = mx.argpartition(-choice, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        weights = mx.take_along_axis(scores if rule.sigmoid else choice, ids, axis=-1)
        if rule.renormalize:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
        return weights * rule.scale, ids

    def forward(self, x: mx.array) -> mx.array:
        out = super().forward(x)
        if self.shared is None:
            return out
        assert self.shared.down is not None
        gate, up = mx.split(project(x, self.shared.gate_up), 2, axis=-1)
        return out + linear(silu(gate) * up, self.shared.down)


class DeepseekLayer(WithMoe):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        mla = self.mla = MlaSpec.from_config(config)
        hidden, h, bias, rank = config.hidden_size, mla.heads, config.attention_bias, mla.q_lora_rank
        self.eps = config.rms_norm_eps
        self.attn_norm: mx.array | None = None
        self.q_a: Weight | None = None
        self.q_a_bias: mx.array | None = None
        self.q_a_norm: mx.array | None = None
        self.q: Weight | None = None
        self.kv_a: Weight | None = None
        self.kv_a_bias: mx.array | None = None
        self.kv_a_norm: mx.array | None = None
        self.kv_b: Weight | None = None
        self.o: Weight | None = None
        self.o_bias: mx.array | None = None
        self.mlp_norm: mx.array | None = None
        self.gate_up: Weight | list[Weight] | None = None
        self.down: Weight | None = None
        self.declare("attn_norm", hidden)
        if rank:
            self.declare("q_a", rank, hidden)
            self.declare("q_a_norm", rank)
            if bias:
                self.declare("q_a_bias", rank)
        self.declare("q", h * mla.qk_dim, rank or hidden)
        self.declare("kv_a", mla.kv_lora_rank + mla.rope_dim, hidden)
        if bias:
            self.declare("kv_a_bias", mla.kv_lora_rank + mla.rope_dim)
            self.declare("o_bias", hidden)
        self.declare("kv_a_norm", mla.kv_lora_rank)
        self.declare("kv_b", h * (mla.nope_dim + mla.v_dim), mla.kv_lora_rank)
        self.declare("o", hidden, h * mla.v_dim)
        self.declare("mlp_norm", hidden)
        spec = MoeSpec.from_config(config)
        self.moe = None
        if index in spec.sparse_layers:
            self.moe = SharedExpertMoe(spec, RouterSpec.from_config(config), hidden)
        else:
            self.declare("gate_up.0", config.intermediate_size, hidden)
            self.declare("gate_up.1", config.intermediate_size, hidden)
            self.declare("down", hidden, config.intermediate_size)

    def __call__(
        self,
        x: mx.array,
        rotary: Rotary,
        positions: mx.array,
        meta: AttentionMetadata,
        cache: LayerCache,
        q_scale: mx.array | None = None,
    ) -> mx.array:
        """`q_scale` [T, 1, 1]: multiplies q after RoPE (Mistral 4's per-token temperature)."""
        m, tokens = self.mla, x.shape[0]
        h, nope, width = m.heads, m.nope_dim, m.cache_dim
        assert self.q is not None and self.kv_a is not None and self.kv_b is not None and self.o is not None
        normed = mx.fast.rms_norm(x, self.attn_norm, self.eps)
        q_in = normed
        if self.q_a is not None:
            q_in = mx.fast.rms_norm(linear(normed, self.q_a, self.q_a_bias), self.q_a_norm, LATENT_NORM_EPS)
        q = linear(q_in, self.q).reshape(tokens, h, m.qk_dim)
        kv_a = linear(normed, self.kv_a, self.kv_a_bias)  # [T, latent | rope]
        latent = mx.fast.rms_norm(kv_a[:, : m.kv_lora_rank], self.kv_a_norm, LATENT_NORM_EPS)
        kv = linear(latent, self.kv_b).reshape(tokens, h, nope + m.v_dim)
        k_rope = rotary(kv_a[:, None, m.kv_lora_rank :], positions)  # [T, 1, rope]: one for all heads
        q = mx.concatenate([q[..., :nope], rotary(q[..., nope:], positions)], axis=-1)
        k = mx.concatenate([kv[..., :nope], mx.broadcast_to(k_rope, (tokens, h, m.rope_dim))], axis=-1)
        v = kv[..., nope:]
        if width > m.v_dim:  # the cache is as wide as the keys: pad, slice off after attention
            v = mx.pad(v, [(0, 0), (0, 0), (0, width - m.v_dim)])
        if width > m.qk_dim:  # zeros add nothing to q.k
            q = mx.pad(q, [(0, 0), (0, 0), (0, width - m.qk_dim)])
            k = mx.pad(k, [(0, 0), (0, 0), (0, width - m.qk_dim)])
        if q_scale is not None:
            q = q * q_scale
        attn = paged_attention(q, k, v, cache, meta, m.softmax_scale)[..., : m.v_dim]  # [T, h, v]
        x = x + linear(attn.reshape(tokens, h * m.v_dim), self.o, self.o_bias)
        normed = mx.fast.rms_norm(x, self.mlp_norm, self.eps)
        if self.moe is not None:
            return x + self.moe.forward(normed)
        assert self.down is not None
        gate, up = mx.split(project(normed, self.gate_up), 2, axis=-1)
        return x + linear(silu(gate) * up, self.down)


class Model(DecoderLM):
    layer_class = DeepseekLayer
