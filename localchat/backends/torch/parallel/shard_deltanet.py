"""Qwen3.5 / Qwen3-Next (gated DeltaNet + gated attention) under tensor parallelism. A DeltaNet layer
is cut by key head and the value heads that read it (value heads are grouped by key head after the
family's sanitize, which runs before the cut): a rank keeps its heads' q, k, v rows of in_proj_qkv and
conv channels, their z, b and a rows, A_log and dt_bias, and out_proj's matching input columns; the
gated norm is per value head (replicated). Nothing crosses ranks until out_proj: one all-reduce per
mixer (the layer's `reduce_partial`), as for attention's o and the MLP's down. Each rank's state slot
holds its heads' recurrent matrices and conv windows."""

from __future__ import annotations

from localchat.backends.torch.models.qwen3_next import HybridLayer

from .shard_llama import AllReduced


class ParallelHybridLayer(AllReduced, HybridLayer):
    """The three row-parallel outputs (DeltaNet's out, attention's o, the MLP's down), each summed."""
