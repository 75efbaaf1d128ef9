"""Nemotron-H (Mamba-2 + attention + relu² MLP blocks) under tensor parallelism. A Mamba-2 mixer is
cut by its SSM groups and the heads that read them: a rank keeps its heads' z, x and dt rows of
in_proj and its groups' B and C rows, the same conv channels (the conv is depthwise), its heads'
A_log, D and dt_bias, and its slice of the gated norm, which normalises within a group, so nothing
crosses ranks until out_proj, row-parallel over the rank's inner columns: one all-reduce per mixer
(the block's `reduce_partial`, as for attention's o and the MLP's down; out_proj's bias is rank 0's
only). Each rank's state slot holds its heads' SSM states and its channels' conv windows. Granite's
embedding and logits multipliers (its model's embed_tokens / logits) wrap the vocab-parallel lookup
and gather through super()."""

from __future__ import annotations

from localchat.backends.torch.models.mamba_hybrid import HybridBlock

from .shard_llama import AllReduced


class ParallelHybridBlock(AllReduced, HybridBlock):
    """A block over this rank's SSM heads, attention heads or MLP columns: each mixer's output summed,
    and Granite's shared SwiGLU plus MoE summed by one all-reduce after both."""
