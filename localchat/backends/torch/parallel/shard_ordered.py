"""A rank's input columns of a GGUF block matrix stored with its columns in another order than the
model reads (weights/ordered_blocks.py: qwen35's ssm_out, value heads tiled by llama.cpp's converter,
each head narrower than a block). A rank keeps the blocks that hold only its columns, in their stored
order, with the order of the columns in them: the same kind of matrix, a narrower one. Where one
block mixes two ranks' columns the rank's columns are dequantized instead (correct, not compact)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from localchat.weights.ordered_blocks import OrderedBlocks
from localchat.weights.tensors import WeightTensor


def ordered_columns_part(w: OrderedBlocks, start: int, count: int) -> WeightTensor:
    """Model input columns [start, start + count) of `w` (stored column j is model column order[j])."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, nbytes = (int(n) for n in GGML_QUANT_SIZES[GGMLQuantizationType[w.qtype]])
    assert w.order is not None
    mine = (w.order >= start) & (w.order < start + count)
    per_block = mine.reshape(-1, block)
    kept = per_block.all(axis=1)
    if not np.array_equal(kept, per_block.any(axis=1)):  # a block holds another rank's columns too
        return WeightTensor(w.name, (w.shape[0], count), "F32", w.dequantize()[:, start : start + count])
    data = np.asarray(w.data).reshape(w.shape[0], -1, nbytes)[:, kept].reshape(w.shape[0], -1)
    return replace(w, shape=(w.shape[0], count), data=np.ascontiguousarray(data), order=w.order[mine] - start)
