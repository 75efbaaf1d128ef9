"""A GGUF block matrix whose input columns a family's layout fix reorders by less than a block: kept in
the file's blocks, stored columns as they are, with the column order beside them (issue #34).

qwen35 / qwen35moe files hold `ssm_out` with its input columns (value heads) tiled by llama.cpp's
converter; the model reads them grouped per key head. A value head 128 wide (Qwen3.5's) is half a
K-quant super-block, so moving whole blocks cannot undo the tiling. Instead the blocks stay as stored and
the activations move: the torch backend runs the blocks through `PermutedWeight` (one index_select of the
input per matmul, the same mechanism GPTQ act-order uses), and a backend that does not run the blocks
calls `dequantize()`: the file's values, columns in the model's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localchat.weights.hf_quant_blocks import RepackedLinear
from localchat.weights.tensors import WeightTensor

ORDERED_DTYPE = "GGUF_ORDERED"  # no backend reads it as is: `blocks()` on the kernels, else `dequantize()`


@dataclass(slots=True)
class OrderedBlocks(RepackedLinear):
    """`data`: the file's `qtype` blocks [out, bytes_per_row]; stored column j multiplies input column
    `order[j]` (RepackedLinear's convention)."""

    def blocks(self) -> WeightTensor:
        return WeightTensor(self.name, self.shape, self.qtype, self.data)

    def dequantize(self) -> np.ndarray:
        stored = self.blocks().dequantize()
        assert self.order is not None
        values = np.empty_like(stored)
        values[:, self.order] = stored
        return values


def ordered_columns(weight: WeightTensor, order: np.ndarray) -> OrderedBlocks:
    """A quantized GGUF matrix whose model-order input column g sits at stored column `order[g]`."""
    return OrderedBlocks(
        name=weight.name,
        shape=weight.shape,
        dtype=ORDERED_DTYPE,
        data=weight.data,
        qtype=weight.dtype,
        zeros=np.zeros(0, np.int8),
        order=np.argsort(order).astype(np.int64),  # for each stored column, the input column it takes
    )
