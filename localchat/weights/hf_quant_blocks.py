"""GPTQ / AWQ / compressed-tensors int4 linears as GGUF Q4_1 or Q4_0 blocks (hf_quant.py's docstring: why
Q4_0 is exact and Q4_1 within half an fp16 ulp of s z per value), so localchat's CPU kernels run them from
~5 bits per weight instead of a dense copy.

GGUF's 32-value blocks: Q4_1 is d (fp16), m (fp16), 16 bytes of codes (value j in the low nibble of byte
j, value j + 16 in its high nibble), value d q + m; Q4_0 is d and the 16 bytes, value d (q - 8).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from localchat.weights.tensors import WeightTensor

BLOCK = 32
REPACKED_DTYPE = "HF_INT4"  # no backend reads it as is: `blocks()` on the kernels, else `dequantize()`
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


@dataclass(slots=True)
class RepackedLinear(WeightTensor):
    """A linear `[out, in]` whose `data` is `qtype` blocks (uint8 [out, bytes_per_row]) over the input
    columns in `order` (act-order: stored column j is input column order[j]; None: as is)."""

    qtype: str  # "Q4_1" or "Q4_0"
    zeros: np.ndarray  # int8 [out, in / 32]: each block's integer zero z (w = d (q - z)), for exact values
    order: np.ndarray | None  # int64 [in]

    def blocks(self) -> WeightTensor:
        """The blocks as a GGUF tensor of `qtype` (columns in `order`)."""
        return WeightTensor(self.name, self.shape, self.qtype, self.data)

    def take_rows(self, rows: np.ndarray) -> RepackedLinear:
        """The same linear with its output rows in `rows`' order (a family's layout fix: DeepSeek's
        de-interleaved rope rows; or a subset, Qwen3-Next's split in_proj): rows are self-contained, so this
        moves bytes and nothing rounds."""
        zeros = self.zeros[rows] if self.zeros.size else self.zeros
        data = np.ascontiguousarray(np.asarray(self.data)[rows])
        return replace(self, shape=(len(rows), self.shape[1]), data=data, zeros=zeros)

    def dequantize(self) -> np.ndarray:
        """The checkpoint's exact float32 values [out, in], input columns in their own order: (q - z) s,
        as the dense path computes them (not d q + m, whose m is rounded)."""
        out, cols = self.shape
        raw = np.asarray(self.data).reshape(out, cols // BLOCK, _BLOCK_BYTES[self.qtype])
        d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        nibbles = raw[..., -16:]
        codes = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1).astype(np.int32)
        values = ((codes - self.zeros[..., None].astype(np.int32)).astype(np.float32) * d[..., None]).reshape(
            out, cols
        )
        if self.order is None:
            return values
        exact = np.empty_like(values)
        exact[:, self.order] = values
        return exact


def repack_int4(
    name: str,
    codes: np.ndarray,
    scales: np.ndarray,
    zeros: np.ndarray | None,
    column_groups: np.ndarray,
) -> RepackedLinear | None:
    """codes [out, in] (0..15), fp16 scales and integer zeros [out, groups] (zeros None: symmetric, w = s
    (q - 8): Q4_0), `column_groups` [in] each input column's group. None where the groups do not come
    whole in 32-column blocks, even once sorted, a scale is no fp16 value or an m overflows fp16 (the
    caller dequantizes)."""
    out, cols = codes.shape
    if cols % BLOCK or out == 0:
        return None
    groups = np.asarray(column_groups, dtype=np.int64)
    ordered = bool(np.all(groups[1:] >= groups[:-1]))
    order = None if ordered else np.argsort(groups, kind="stable")
    sorted_groups = groups if order is None else groups[order]
    per_block = sorted_groups.reshape(-1, BLOCK)
    if not np.all(per_block == per_block[:, :1]):
        return None
    block_group = per_block[:, 0]
    wide = np.asarray(scales, dtype=np.float32)[:, block_group]
    s = wide.astype(np.float16)  # [out, blocks]: d = s exactly (fp16 checkpoints; bf16/f32 ones checked)
    if not np.array_equal(s.astype(np.float32), wide):
        return None
    z = np.full(s.shape, 8, np.int8) if zeros is None else np.asarray(zeros)[:, block_group].astype(np.int8)
    q = np.asarray(codes, dtype=np.uint8) if order is None else np.asarray(codes, dtype=np.uint8)[:, order]
    halves = q.reshape(out, -1, 2, 16)
    packed = halves[:, :, 0] | (halves[:, :, 1] << 4)  # [out, blocks, 16]
    head = [np.ascontiguousarray(s).view(np.uint8).reshape(out, -1, 2)]
    qtype = "Q4_0"
    if zeros is not None:
        qtype = "Q4_1"
        with np.errstate(over="ignore"):
            m = (-(s.astype(np.float32) * z)).astype(np.float16)  # s z exact in float32, rounded once
        if not np.all(np.isfinite(m)):
            return None
        head.append(np.ascontiguousarray(m).view(np.uint8).reshape(out, -1, 2))
    blocks = np.concatenate([*head, packed], axis=-1).reshape(out, -1)
    return RepackedLinear(
        name=name, shape=(out, cols), dtype=REPACKED_DTYPE, data=blocks, qtype=qtype, zeros=z, order=order
    )


def reorder_rows(weight: WeightTensor, rows: np.ndarray) -> WeightTensor:
    """`weight` with its output rows (the first axis: dense values, GGUF block rows, a repacked linear's
    blocks with their zeros and scales) in `rows`' order, of the same kind as it came."""
    if isinstance(weight, RepackedLinear):
        return weight.take_rows(rows)
    data = np.asarray(weight.data)
    moved = np.ascontiguousarray(data.reshape(weight.shape[0], -1)[rows]).reshape(data.shape)
    return WeightTensor(weight.name, weight.shape, weight.dtype, moved)
