"""The one place tensor parallelism enters a layer's forward. A row-parallel projection (attention's o,
an MLP's down, a mixer's out_proj) gives each rank a partial sum of the output; the layers pass that
output through `reduce_partial`, which parallel/shard_llama.py's `AllReduced` turns into an all-reduce.
The forwards themselves are shared, so a sharded layer cannot drift from its one-device twin."""

from __future__ import annotations

import torch
from torch import nn


class PartialSums(nn.Module):
    def reduce_partial(self, x: torch.Tensor) -> torch.Tensor:
        """A row-parallel projection's output: whole already on one device (summed across ranks under --tp)."""
        return x
