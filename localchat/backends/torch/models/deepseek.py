"""DeepSeek-V2 / V2-Lite and V3 / R1 (and checkpoints of their model_type): multi-head latent
attention, then a dense SwiGLU in the first `first_k_dense_replace` layers and a shared-expert mixture
of experts after them. Sizes, router rules and the checkpoint layout: localchat/arch/deepseek.py.

Attention: q = q_proj(x) (or q_b(norm(q_a(x)))), per head nope | rope; kv_a(x) = latent | shared rope key;
kv_b(norm(latent)) = per head nope key | value. RoPE turns the rope dims (rows de-interleaved at load,
so it is the usual rotate-half), the shared rope key is copied to every head, and the cache stores the
expanded keys and the values zero-padded to the key width (kv_heads = heads), sliced off afterwards.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from localchat.arch.deepseek import LATENT_NORM_EPS, MlaSpec, RouterSpec
from localchat.arch.moe import MoeSpec
from localchat.backends.torch.attention import paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import apply_rope, empty_param, rms_norm, swiglu
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.moe import Expert, SparseMoe
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.quant import linear
from localchat.weights.config import ModelConfig


class SharedExpertMoe(SparseMoe):
    """SparseMoe's batched dispatch with DeepSeek's router, plus the shared expert every token takes."""

    def __init__(self, spec: MoeSpec, router: RouterSpec, hidden: int) -> None:
        super().__init__(spec, hidden)
        self.rule = router
        self.score_bias = empty_param(spec.experts) if router.sigmoid else None  # V3: for choosing only
        self.shared = Expert(hidden, spec.shared_size) if spec.shared_size else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k]); scores in float32."""
        rule, tokens = self.rule, x.shape[0]
        logits = F.linear(x.float(), self.router.float())  # [T, experts]
        scores = logits.sigmoid() if rule.sigmoid else logits.softmax(dim=-1)
        choice = scores if self.score_bias is None else scores + self.score_bias.float()
        if rule.groups > 1:
            grouped = choice.view(tokens, rule.groups, -1)
            # V3 ranks a group by its two best (biased) scores, V2 by its best one.
            rank = grouped.topk(2, dim=-1).values.sum(dim=-1) if rule.sigmoid else grouped.amax(dim=-1)
            kept = torch.zeros_like(rank, dtype=torch.bool)
            kept.scatter_(1, rank.topk(rule.groups_used, dim=-1).indices, True)
            # Softmax scores are >= 0, so V2 masks with 0 (as transformers does); V3's biased ones with -inf.
            fill = -math.inf if rule.sigmoid else 0.0
            choice = choice.masked_fill(~kept.repeat_interleave(grouped.shape[-1], dim=1), fill)
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = (scores if rule.sigmoid else choice).gather(1, ids)
        if rule.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (weights * rule.scale).to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.shared is None:
            return out
        return out + linear(swiglu(linear(x, self.shared.gate_up)), self.shared.down)


class DeepseekLayer(PartialSums):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        mla = self.mla = MlaSpec.from_config(config)
        hidden, h, bias = config.hidden_size, mla.heads, config.attention_bias
        self.eps = config.rms_norm_eps
        # paged_attention scales by cache_dim ** -0.5: q carries the rest (yarn's mscale², a wider cache).
        self.q_scale = mla.softmax_scale * math.sqrt(mla.cache_dim)
        self.attn_norm = empty_param(hidden)
        rank = mla.q_lora_rank
        self.q_a = empty_param(rank, hidden) if rank else None
        self.q_a_bias = empty_param(rank) if rank and bias else None
        self.q_a_norm = empty_param(rank) if rank else None
        self.q = empty_param(h * mla.qk_dim, rank or hidden)
        self.kv_a = empty_param(mla.kv_lora_rank + mla.rope_dim, hidden)
        self.kv_a_bias = empty_param(mla.kv_lora_rank + mla.rope_dim) if bias else None
        self.kv_a_norm = empty_param(mla.kv_lora_rank)
        self.kv_b = empty_param(h * (mla.nope_dim + mla.v_dim), mla.kv_lora_rank)
        self.o = empty_param(hidden, h * mla.v_dim)
        self.o_bias = empty_param(hidden) if bias else None
        self.mlp_norm = empty_param(hidden)
        spec = MoeSpec.from_config(config)
        sparse = index in spec.sparse_layers
        self.moe = SharedExpertMoe(spec, RouterSpec.from_config(config), hidden) if sparse else None
        self.gate_up = None if sparse else empty_param(2 * config.intermediate_size, hidden)
        self.down = None if sparse else empty_param(hidden, config.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
        q_temperature: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`q_temperature` [T, 1, 1]: multiplies q after RoPE (Mistral 4's per-token temperature)."""
        m, tokens = self.mla, x.shape[0]
        h, nope, width = m.heads, m.nope_dim, m.cache_dim
        normed = rms_norm(x, self.attn_norm, self.eps)
        q_in = normed
        if self.q_a is not None:
            q_in = rms_norm(linear(normed, self.q_a, self.q_a_bias), self.q_a_norm, LATENT_NORM_EPS)
        q = linear(q_in, self.q).view(tokens, h, m.qk_dim)
        kv_a = linear(normed, self.kv_a, self.kv_a_bias)  # [T, latent | rope]
        latent = rms_norm(kv_a[:, : m.kv_lora_rank], self.kv_a_norm, LATENT_NORM_EPS)
        kv = linear(latent, self.kv_b).view(tokens, h, nope + m.v_dim)
        k_rope = apply_rope(kv_a[:, None, m.kv_lora_rank :], cos, sin)  # [T, 1, rope]: one for all heads
        q = torch.cat((q[..., :nope], apply_rope(q[..., nope:], cos, sin)), dim=-1)
        k = torch.cat((kv[..., :nope], k_rope.expand(tokens, h, m.rope_dim)), dim=-1)
        v = F.pad(kv[..., nope:], (0, width - m.v_dim))
        if width > m.qk_dim:  # zeros add nothing to q.k
            q, k = F.pad(q, (0, width - m.qk_dim)), F.pad(k, (0, width - m.qk_dim))
        if self.q_scale != 1.0:
            q = q * self.q_scale
        if q_temperature is not None:
            q = q * q_temperature
        attn = paged_attention(q, k, v, kv_cache, meta)[..., : m.v_dim]  # [T, h, v]
        x = x + self.reduce_partial(linear(attn.reshape(tokens, h * m.v_dim), self.o, self.o_bias))
        normed = rms_norm(x, self.mlp_norm, self.eps)
        if self.moe is not None:
            return x + self.reduce_partial(self.moe.forward(normed))
        assert self.gate_up is not None and self.down is not None
        return x + self.reduce_partial(linear(swiglu(linear(normed, self.gate_up)), self.down))


class Model(DecoderLM):
    layer_class = DeepseekLayer
    capturable = False  # expert dispatch sizes its groups on the host (moe.py)
