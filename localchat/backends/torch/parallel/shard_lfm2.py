"""LFM2 under tensor parallelism: its attention and SwiGLU MLP are cut as Llama's (shard_weights.py),
its short-conv layers by channel. The conv is depthwise, so a channel's B, C and x rows of in_proj,
its conv taps and its state window stay on one rank with no communication; out_proj is row-parallel
(its input columns are the rank's channels), so the mixer's output, conv or attention alike, is
summed by one all-reduce, and the MLP's by another. Each rank's state slots hold its channels'
windows only (1/N of a sequence's state), its KV pool its heads'."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import StepMetadata
from localchat.backends.torch.models.lfm2 import Lfm2Layer

from .shard_llama import ParallelLlama


class ParallelLfm2Layer(Lfm2Layer):
    """The MLP's down projection is row-parallel: its partial sums are added across the stage's ranks."""

    tp_group: Any = None

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        out = super().mlp(x)
        dist.all_reduce(out, group=self.tp_group)
        return out


class ParallelLfm2(ParallelLlama):
    """The conv's out_proj and attention's o are row-parallel: one all-reduce of the mixer's output."""

    def mixer(
        self,
        layer: Lfm2Layer,
        normed: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
        index: list[int],
    ) -> torch.Tensor:
        out: torch.Tensor = super().mixer(layer, normed, cos, sin, meta, kv_caches, index)  # type: ignore[misc]
        dist.all_reduce(out, group=self.tp_group)
        return out
