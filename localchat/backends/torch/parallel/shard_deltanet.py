"""Qwen3.5 / Qwen3-Next (gated DeltaNet + gated attention) under tensor parallelism. A DeltaNet layer
is cut by key head and the value heads that read it (value heads are grouped by key head after the
family's sanitize, which runs before the cut): a rank keeps its heads' q, k, v rows of in_proj_qkv and
conv channels, their z, b and a rows, A_log and dt_bias, and out_proj's matching input columns; the
gated norm is per value head (replicated). Nothing crosses ranks until out_proj: one all-reduce per
mixer, as for attention's o and the MLP's down. Each rank's state slot holds its heads' recurrent
matrices and conv windows."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import StepMetadata
from localchat.backends.torch.models.qwen3_next import HybridLayer
from localchat.backends.torch.state_cache import StateCache, StepRows


def _summed(x: torch.Tensor, group: Any) -> torch.Tensor:
    dist.all_reduce(x, group=group)
    return x


class ParallelHybridLayer(HybridLayer):
    """The three row-parallel outputs (DeltaNet's out, attention's o, the MLP's down), each summed."""

    tp_group: Any = None

    def linear_attention(self, x: torch.Tensor, rows: StepRows, cache: StateCache, slot: int) -> torch.Tensor:
        return _summed(super().linear_attention(x, rows, cache, slot), self.tp_group)

    def attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepMetadata, kv_cache: KVCache
    ) -> torch.Tensor:
        return _summed(super().attention(x, cos, sin, meta, kv_cache), self.tp_group)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return _summed(super().mlp(x), self.tp_group)
