"""Nemotron-H (Mamba-2 + attention + relu² MLP blocks) under tensor parallelism. A Mamba-2 mixer is
cut by its SSM groups and the heads that read them: a rank keeps its heads' z, x and dt rows of
in_proj and its groups' B and C rows, the same conv channels (the conv is depthwise), its heads'
A_log, D and dt_bias, and its slice of the gated norm, which normalises within a group, so nothing
crosses ranks until out_proj, row-parallel over the rank's inner columns: one all-reduce per mixer,
as for attention's o and the MLP's down. Each rank's state slot holds its heads' SSM states and its
channels' conv windows."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.mamba2 import Mamba2Mixer
from localchat.backends.torch.models.base import StepMetadata
from localchat.backends.torch.models.mamba_hybrid import HybridBlock
from localchat.backends.torch.state_cache import StepRows

from .shard_llama import ParallelLlama


def _summed(x: torch.Tensor, group: Any) -> torch.Tensor:
    dist.all_reduce(x, group=group)
    return x


class ParallelMamba2Mixer(Mamba2Mixer):
    tp_group: Any = None

    def forward(
        self, x: torch.Tensor, rows: StepRows, windows: torch.Tensor, states: torch.Tensor
    ) -> torch.Tensor:
        return _summed(super().forward(x, rows, windows, states), self.tp_group)  # out_bias: rank 0's


class ParallelHybridBlock(HybridBlock):
    """Attention's o and the relu² MLP's down are row-parallel: their outputs summed across the ranks."""

    tp_group: Any = None

    def attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepMetadata, kv_cache: KVCache
    ) -> torch.Tensor:
        return _summed(super().attention(x, cos, sin, meta, kv_cache), self.tp_group)

    def relu2_mlp(self, x: torch.Tensor) -> torch.Tensor:
        return _summed(super().relu2_mlp(x), self.tp_group)

    def granite_mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Granite's shared SwiGLU plus its MoE block: both row-parallel, summed by one all-reduce."""
        return _summed(super().granite_mlp(x), self.tp_group)


class ParallelMambaHybrid(ParallelLlama):
    """Vocab-parallel embedding and LM head, with Granite's embedding and logits scales after them."""

    granite: bool

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed_tokens(input_ids)
        scale = float(self.config.extra.get("embedding_multiplier") or 1.0) if self.granite else 1.0
        return x if scale == 1.0 else x * scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = super().logits(hidden)
        scale = float(self.config.extra.get("logits_scaling") or 1.0) if self.granite else 1.0
        return out if scale == 1.0 else out / scale


def shard_mixer(block: HybridBlock, tp_group: Any) -> None:
    """A block's Mamba-2 mixer, if any, with the all-reduce after out_proj (switched in place)."""
    if block.mamba is not None:
        block.mamba.__class__ = ParallelMamba2Mixer
        setattr(block.mamba, "tp_group", tp_group)  # noqa: B010
