"""Gemma 2 / 3 under tensor parallelism: the Llama slice (shard.py, shard_weights.py: heads, GeGLU
columns, vocab rows) with Gemma's own forward. The layer's o and down projections are row-parallel,
so their partial products are summed (one all-reduce each) before Gemma's post-attention and
post-MLP norms, which need the whole vector; the embedding's sqrt(hidden) scale follows the
vocab-parallel lookup, the final soft-cap the gathered logits. Sliding and global layers, the
attention soft-cap and Gemma 3's q/k norms and second RoPE base act per head, so each rank applies
them to its own heads unchanged."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from localchat.backends.torch.attention import rope_paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import rms_norm
from localchat.backends.torch.models.base import StepMetadata
from localchat.backends.torch.models.gemma import GemmaLayer
from localchat.backends.torch.quant import linear

from .shard_llama import ParallelLlama


def _all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    dist.all_reduce(x, group=group)
    return x


class ParallelGemmaLayer(GemmaLayer):
    """GemmaLayer over this rank's heads and MLP columns, the two row-parallel sums before the norms."""

    tp_group: Any = None

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
        attn_out = _all_reduce(linear(attn.reshape(tokens, h * d), self.o), self.tp_group)
        x = x + rms_norm(attn_out, self.post_attn_norm, eps)
        gate_up = linear(rms_norm(x, self.mlp_norm, eps), self.gate_up)
        inter = gate_up.shape[-1] // 2
        act = F.gelu(gate_up[:, :inter], approximate="tanh") * gate_up[:, inter:]
        return x + rms_norm(_all_reduce(linear(act, self.down), self.tp_group), self.post_mlp_norm, eps)


class ParallelGemma(ParallelLlama):
    """Vocab-parallel embedding (then Gemma's sqrt(hidden) scale) and LM head (then its soft-cap)."""

    final_softcap: float | None

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed_tokens(input_ids)
        return x * torch.tensor(math.sqrt(self.config.hidden_size), dtype=x.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().logits(hidden)
        cap = self.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
