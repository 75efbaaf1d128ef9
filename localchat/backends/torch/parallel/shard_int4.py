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

An MLP's act-order down (dense, experts, shared experts) avoids that fallback (`act_order_mlp`, before the cut): its intermediate
dim is permuted into down's stored order (gate's and up's rows moved to match; SiLU(gate) * up is
elementwise, so the MLP is the same function), which makes down's stored columns the input's in order, and
every rank's contiguous cut whole blocks. o's input (heads' value dims) has no such freedom: o keeps the
float32 fallback under act-order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import cast

import numpy as np

from localchat.arch.architecture import Architecture
from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.hf_quant_blocks import BLOCK, RepackedLinear, reorder_rows
from localchat.weights.ordered_blocks import OrderedBlocks
from localchat.weights.tensors import WeightTensor

DEQUANT_ROWS = 256  # rows dequantized at a time when a column cut cannot keep whole blocks
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


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


def act_order_mlp(weights: Iterable[WeightTensor], arch: Architecture) -> Iterator[WeightTensor]:
    """The stream with each MLP (dense, an expert, a shared expert) whose down is an act-order int4 linear
    permuted along its
    intermediate dim into down's stored order: down's `order` dropped, gate's and up's rows (and biases)
    taken in that order. A layer's int4 gate / up (and biases) that come before its down wait for it (one
    layer's compact tensors); a float gate / up before it leaves that layer as is."""
    waiting: dict[str, list[WeightTensor]] = {}  # layer -> its gate / up pieces held until down
    orders: dict[str, np.ndarray | None] = {}  # layer -> the permutation (None: left as is), once down came
    for w in weights:
        match = LAYER_NAME.fullmatch(w.name)
        found = arch.layer_weight(match.group(2)) if match else None
        module, _, leaf = found[0].rpartition(".") if found else ("", "", "")
        if match is None or found is None or leaf not in ("gate_up", "gate_up_bias", "down"):
            yield w
            continue
        layer, parts = f"{match.group(1)}:{module}", found[2]  # one MLP: the dense one, an expert, shared
        if leaf == "down":
            order = w.order if is_int4(w) and layer not in orders else None  # type: ignore[attr-defined]
            orders[layer] = order
            held = waiting.pop(layer, [])
            if order is None:
                yield from held
                yield w
                continue
            yield from (reorder_rows(piece, order) for piece in held)
            yield replace(cast(RepackedLinear, w), order=None)
        elif parts != 2:  # a fused gate | up (one tensor): not permuted
            orders.setdefault(layer, None)
            yield from waiting.pop(layer, [])
            yield w
        elif layer in orders:
            order = orders[layer]
            yield w if order is None else reorder_rows(w, order)
        elif is_int4(w) or leaf == "gate_up_bias":
            waiting.setdefault(layer, []).append(w)
        else:  # a float gate / up before down: this layer stays as it is
            orders[layer] = None
            yield from waiting.pop(layer, [])
            yield w
    for held in waiting.values():
        yield from held


def exact(w: WeightTensor) -> WeightTensor:
    """An int4 linear as its exact float32 values (cuts that slice raw rows: the vocab, MLA's heads)."""
    return WeightTensor(w.name, w.shape, "F32", w.dequantize()) if is_int4(w) else w
