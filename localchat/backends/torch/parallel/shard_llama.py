"""The Llama-layout pieces of tensor parallelism that every family's shard module builds on: the
all-reduce behind the layers' `reduce_partial` hook, the sharded Llama layer, and the vocab-parallel
embedding and LM head. Kept apart from shard.py, which picks a family's classes, so the family modules
import these without a cycle."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from localchat.backends.torch.layers import rms_norm
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.quant import embed_rows, linear


def _all_reduce(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    dist.all_reduce(x, group=group)
    return x


class AllReduced(PartialSums):
    """The layers' row-parallel outputs summed across `tp_group`: the one thing a Parallel* layer adds
    to its family's layer (mixed in first, so this `reduce_partial` is the one the shared forward calls)."""

    tp_group: Any = None  # the ranks sharing this layer (None: all of them; a stage's under TP x PP)

    def reduce_partial(self, x: torch.Tensor) -> torch.Tensor:
        return _all_reduce(x, self.tp_group)


class ParallelLlamaLayer(AllReduced, LlamaLayer):
    """LlamaLayer over this rank's heads and MLP columns: o's and the MLP block's sums (an MoE's too)."""


class ParallelLlama(DecoderLM):
    """Vocab-parallel embedding and LM head around the sharded layers, mixed in after the family's model
    class (shard.py), so a family's own embed_tokens / logits wrap these through super()."""

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
