"""Nemotron-H (Mamba-2 + attention + relu² MLP blocks) under tensor parallelism. A Mamba-2 mixer is
cut by its SSM groups and the heads that read them: a rank keeps its heads' z, x and dt rows of
in_proj and its groups' B and C rows, the same conv channels (the conv is depthwise), its heads'
A_log, D and dt_bias, and its slice of the gated norm, which normalises within a group, so nothing
crosses ranks until out_proj, row-parallel over the rank's inner columns: one all-reduce per mixer
(the block's `reduce_partial`, as for attention's o and the MLP's down; out_proj's bias is rank 0's
only). Each rank's state slot holds its heads' SSM states and its channels' conv windows."""

from __future__ import annotations

import torch

from localchat.backends.torch.models.mamba_hybrid import HybridBlock

from .shard_llama import AllReduced, ParallelLlama


class ParallelHybridBlock(AllReduced, HybridBlock):
    """A block over this rank's SSM heads, attention heads or MLP columns: each mixer's output summed,
    and Granite's shared SwiGLU plus MoE summed by one all-reduce after both."""


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
