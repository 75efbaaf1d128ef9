"""LFM2 under tensor parallelism: its attention and SwiGLU MLP are cut as Llama's (shard_weights.py),
its short-conv layers by channel. The conv is depthwise, so a channel's B, C and x rows of in_proj,
its conv taps and its state window stay on one rank with no communication; out_proj is row-parallel
(its input columns are the rank's channels), so the mixer's output, conv or attention alike, is
summed by one all-reduce (the layer's `reduce_partial`), and the MLP's by another. Each rank's state
slots hold its channels' windows only (1/N of a sequence's state), its KV pool its heads'."""

from __future__ import annotations

from localchat.backends.torch.models.lfm2 import Lfm2Layer

from .shard_llama import AllReduced


class ParallelLfm2Layer(AllReduced, Lfm2Layer):
    """An LFM2 layer over this rank's channels or heads and MLP columns: its two outputs summed."""
