"""A rank's slice of a GPTQ / AWQ / compressed-tensors W4A16 int4 linear (`RepackedLinear`,
weights/hf_quant_blocks.py: the checkpoint repacked at load into 32-value Q4_1 / Q4_0 blocks, each block
one group's scale and zero, act-order columns sorted by group once), kept as those blocks.

Rows (column-parallel q / k / v, gate / up, their fused parts): whole rows, each a run of blocks with its
integer zeros; the column `order` is the input's and stays. Input columns (row-parallel o / down): the
rank's input columns are a set of stored columns (all of them, in the stored order); where that set is
whole 32-column blocks the rank keeps those blocks, their zeros and the order restricted to them (a
checkpoint without act-order cut on a multiple of 32: a byte range of every row; group sizes 32-128 each
fill whole blocks, so a cut need not fall on a group boundary, only on a block's). Otherwise (a cut off
the 32-column grid, or act-order scattering the rank's columns across blocks shared with other ranks)
that tensor alone keeps the rank's exact float32 columns, dequantized a few rows at a time: a block's
32 values share one scale, so columns of two groups cannot share a block exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.hf_quant_blocks import BLOCK, RepackedLinear
from localchat.weights.ordered_blocks import OrderedBlocks
from localchat.weights.tensors import WeightTensor

DEQUANT_ROWS = 256  # rows dequantized at a time when a column cut cannot keep whole blocks


def is_int4(w: WeightTensor) -> bool:
    """hf_quant's repacked int4 linear (not its FP8 / int8 or ordered-block subclasses)."""
    return isinstance(w, RepackedLinear) and not isinstance(w, (OrderedBlocks, Q8Linear))


def int4_rows(w: RepackedLinear, ranges: Sequence[tuple[int, int]]) -> RepackedLinear:
    """Rows [start, start + count) of each range, in order: the same blocks, zeros and column order."""
    if len(ranges) == 1:  # one range: slices, no index gather
        start, count = ranges[0]
        data = np.asarray(w.data)[start : start + count]
        return replace(w, shape=(count, w.shape[1]), data=data, zeros=w.zeros[start : start + count])
    return w.take_rows(np.concatenate([np.arange(start, start + count) for start, count in ranges]))


def stored_blocks(w: RepackedLinear, start: int, count: int) -> np.ndarray | None:
    """The stored blocks that hold exactly input columns [start, start + count), in stored order; None
    where some block mixes them with other columns."""
    if w.order is None:
        if start % BLOCK or count % BLOCK:
            return None
        return np.arange(start // BLOCK, (start + count) // BLOCK)
    mine = (w.order >= start) & (w.order < start + count)
    per_block = mine.reshape(-1, BLOCK)
    whole = per_block.all(axis=1)
    if not np.array_equal(whole, per_block.any(axis=1)):
        return None
    return np.flatnonzero(whole)


def int4_columns(w: RepackedLinear, start: int, count: int) -> WeightTensor:
    """Input columns [start, start + count) of every row: a RepackedLinear of the whole one's blocks,
    or exact float32 columns where the rank's columns do not fill whole blocks."""
    rows, cols = w.shape
    picked = stored_blocks(w, start, count)
    if picked is None:
        chunks = [
            w.take_rows(np.arange(i, min(i + DEQUANT_ROWS, rows))).dequantize()[:, start : start + count]
            for i in range(0, rows, DEQUANT_ROWS)
        ]
        return WeightTensor(w.name, (rows, count), "F32", np.concatenate(chunks))
    data = np.asarray(w.data)
    block_bytes = data.shape[1] // (cols // BLOCK)
    if w.order is None:  # a contiguous byte range of every row
        first = int(picked[0]) * block_bytes
        blocks = data[:, first : first + len(picked) * block_bytes]
        return replace(w, shape=(rows, count), data=blocks, zeros=w.zeros[:, picked[0] : picked[-1] + 1])
    blocks = np.ascontiguousarray(data.reshape(rows, -1, block_bytes)[:, picked].reshape(rows, -1))
    order = (w.order.reshape(-1, BLOCK)[picked].reshape(-1) - start).astype(np.int64)
    kept = None if np.array_equal(order, np.arange(count)) else order
    zeros = np.ascontiguousarray(w.zeros[:, picked])
    return replace(w, shape=(rows, count), data=blocks, zeros=zeros, order=kept)
