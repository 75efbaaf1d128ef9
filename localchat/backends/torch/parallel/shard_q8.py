"""A rank's slice of an FP8 / int8 checkpoint linear (`Q8Linear`, weights/hf_q8_blocks.py: DeepSeek-V3's
block-scaled e4m3 with its `weight_scale_inv` per 128 x 128 tile, AutoFP8's per-tensor scale,
compressed-tensors FP8 / W8A8), kept in its compact form: the rank's codes with the scales that cover
them, which the CPU kernels turn into Q8_0 blocks at load and other backends dequantize exactly.

Rows (column-parallel weights, MLA's heads, experts' gate / up): the rank's rows of codes; the scale's
block rows when the cut starts on a scale block, else one scale row per kept row (`take_rows`: 4 bytes
per 128 values more). Input columns (row-parallel o / down): the rank's codes with the scale's block
columns when the cut starts on a scale block, else the scale re-tiled per 32 columns (Q8_0's block),
which any cut on a multiple of 32 keeps exact. A cut that splits 32-value blocks (no Q8_0 form) keeps
the rank's exact float32 columns, dequantized a few rows at a time. DeepSeek-V3 at `--tp 2` to 8 cuts
every tensor on 128-value boundaries, so its slices keep the checkpoint's own tiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.hf_quant_blocks import BLOCK
from localchat.weights.tensors import WeightTensor

DEQUANT_ROWS = 256  # rows dequantized at a time when a column cut splits 32-value blocks


def q8_rows(w: Q8Linear, ranges: Sequence[tuple[int, int]]) -> Q8Linear:
    """Rows [start, start + count) of each range, in order."""
    if len(ranges) == 1:
        start, count = ranges[0]
        codes = np.asarray(w.data)[start : start + count]
        if w.scale.size == 1:
            return replace(w, shape=(count, w.shape[1]), data=codes)
        first = w.reps[0]
        if start % first == 0:  # the scale's block rows that cover the kept rows
            scale = w.scale[start // first : -(-(start + count) // first)]
            return replace(w, shape=(count, w.shape[1]), data=codes, scale=np.ascontiguousarray(scale))
    picked = np.concatenate([np.arange(start, start + count) for start, count in ranges])
    return w.take_rows(picked)


def q8_columns(w: Q8Linear, start: int, count: int) -> WeightTensor:
    """Input columns [start, start + count) of every row: a Q8Linear, or exact float32 columns where the
    cut splits Q8_0's 32-value blocks."""
    rows = w.shape[0]
    if start % BLOCK or count % BLOCK:
        chunks = [
            w.take_rows(np.arange(i, min(i + DEQUANT_ROWS, rows))).dequantize()[:, start : start + count]
            for i in range(0, rows, DEQUANT_ROWS)
        ]
        return WeightTensor(w.name, (rows, count), "F32", np.concatenate(chunks))
    codes = np.ascontiguousarray(np.asarray(w.data)[:, start : start + count])
    scale, reps = w.scale, w.reps
    if scale.size > 1:
        if start % reps[1]:  # re-tile the scale per 32 columns: the cut then starts on a tile
            scale = np.repeat(scale, reps[1] // BLOCK, axis=1)
            reps = (reps[0], BLOCK)
        scale = np.ascontiguousarray(scale[:, start // reps[1] : -(-(start + count) // reps[1])])
    return replace(w, shape=(rows, count), data=codes, scale=scale, reps=reps)
