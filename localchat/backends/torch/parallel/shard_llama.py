"""The Llama-layout pieces of tensor parallelism that every family's shard module builds on: the
sharded Llama layer (two all-reduces) and the vocab-parallel embedding and LM head. Kept apart from
shard.py, which picks a family's classes, so the family modules import these without a cycle."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from localchat.backends.torch.attention import paged_attention, rope_paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import add_rms_norm, apply_rope, rms_norm
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.quant import embed_rows, linear


def _all_reduce(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    dist.all_reduce(x, group=group)
    return x


class ParallelLlamaLayer(LlamaLayer):
    """LlamaLayer over this rank's heads and MLP columns, with the two all-reduces of a TP layer."""

    tp_group: Any = None  # the ranks sharing this layer (None: all of them; a stage's under TP x PP)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
        q_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = linear(rms_norm(x, self.attn_norm, self.eps), self.qkv, self.qkv_bias).view(
            tokens, h + 2 * kvh, d
        )
        qk, v = self.normalize_qk(qkv[:, : h + kvh]), qkv[:, h + kvh :]
        if q_scale is None:
            attn = rope_paged_attention(qk, v, cos, sin, kv_cache, meta, self.attn_options)
        else:
            qk = apply_rope(qk, cos, sin)
            attn = paged_attention(qk[:, :h] * q_scale, qk[:, h:], v, kv_cache, meta, self.attn_options)
        # o_bias is zero on ranks other than 0 (shard_weights.py), so the sum adds it once.
        attn_out = _all_reduce(linear(attn.reshape(tokens, h * d), self.o, self.o_bias), self.tp_group)
        x, normed = add_rms_norm(x, attn_out, self.mlp_norm, self.eps)
        return x + _all_reduce(self.mlp(normed), self.tp_group)


class ParallelLlama(DecoderLM):
    """Vocab-parallel embedding and LM head around the sharded layers (mixed into the family's class)."""

    vocab_start: int
    vocab_rows: int  # real rows of this rank's vocab slice (the last one may be padded)
    vocab_size: int
    world_size: int
    tp_group: Any = None

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_rows)
        rows = embed_rows(torch.where(mine, local, 0), self.embed, self.norm.dtype)
        return _all_reduce(rows * mine[:, None].to(rows.dtype), self.tp_group)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        x = rms_norm(hidden, self.norm, self.config.rms_norm_eps)
        part = linear(x, self.embed if self.lm_head is None else self.lm_head).contiguous()
        parts = [torch.empty_like(part) for _ in range(self.world_size)]
        dist.all_gather(parts, part, group=self.tp_group)
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]
