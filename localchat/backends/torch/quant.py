"""The one place that knows about quantization: weight conversion at load, and the matmul every
projection calls.

With localchat's compiled CPU kernels (kernels.py, csrc/; the default on CPU with bfloat16) every GGUF
matrix of a type they read (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, the i-quants IQ1_S to
IQ4_XS, the ternary TQ1_0/TQ2_0 and MXFP4: kernels.BLOCKS) stays in the file's blocks
(`BlockMatrix`): linears, the LM head, and the token embedding, whose rows are dequantized on lookup.
One form serves every step size, so there are no dense copies; memory is the file's size. Activations
are rounded to 8 bits per 32 values for the integer dot products (bound in test_kernels_matmul.py), or
with `LOCALCHAT_KERNEL_ACTIVATIONS=precise` also their 8-bit residual (~15 bits, twice the integer work;
test_kernels_precise.py). Other GGUF types (F16, ...) are dequantized to the compute dtype.
Small models (SMALL_MODEL_BYTES, ~0.5B parameters) get precise activations in `auto`. Their Q4_0/Q4_1
linears used to take torch's int4 kernel (below) with bf16 copies; since a decode step's layers run as
one C call on block matrices (decode_step.py), the blocks decode SmolLM2-135M ~2x faster in two thirds of
the memory. `LOCALCHAT_TORCH_QUANT=copies` keeps bf16 copies of the block matrices for many-row steps
(SmolLM2: prefill ~2.5x faster for ~210 MB; 1B Q4_K_M: ~1.5x faster, peak RSS ~3x; the README's
Benchmarks); `auto` does that where RAM allows only on the portable C kernels, whose many-row path is the
slow one (AVX2, AVX-512 VNNI and NEON read the x16 layout at every row count: csrc/lc_x16_avx512.h, lc_x16_avx2.h, lc_x16_neon.h).

With float32 compute (CPUs without native bf16) `auto` (on the AVX2/AVX-512 kernels) and `int4` put every
GGUF matrix, Q4_0/Q4_1 included, on our kernels (float32 activations in and out): a dense float32 copy
costs 4 bytes a weight. `dequant` is the exact path (the parity tests load with it).

Without the kernels (not built, or `LOCALCHAT_KERNELS=off`) the pure-torch path below applies.

GGUF Q4_0 / Q4_1 linears keep their 4-bit codes on CPU with bfloat16 compute: each 32-value block
becomes one group of torch's int4 weight-only kernel (`_weight_int4pack_mm_for_cpu`), which computes
`w = (q - 8) * scale + zero` per group (checked against a dequantized reference in
tests/backends/test_torch_quant.py):

| GGUF block | GGUF value | kernel q | scale | zero |
|---|---|---|---|---|
| Q4_0: d f16, 16 bytes of nibbles | d * (q - 8) | q | d | 0 |
| Q4_1: d f16, m f16, 16 bytes of nibbles | d * q + m | q | d | m + 8 d |

The kernel wants scale/zero in the activation dtype, so d (f16, 11 significant bits) and m + 8d round
to bfloat16 (8 bits): each moves by at most 2^-8 of itself, shared by the group's 32 weights (the dense
bf16 path rounds each weight by the same bound, independently). The kernel then sums in float32 and
rounds its output once (tests/backends/test_torch_quant.py). float32/float16 activations would keep the
scales exact, but the kernel has no fast path for them (30-50x slower on the dev box).

One-row steps read ~5 bits per weight instead of 16: the 30 layers of SmolLM2-135M take 6.5 instead of
14 ms per token on one thread (3.7 vs 8 on two). The kernel is compute-bound, though: at 16 rows (one
thread) to 32 (two) it only ties a dense oneDNN GEMM, and a 507-token prefill runs 1.9x slower. So
when memory allows (`QuantPolicy.dense_copy`) each int4 matrix also keeps its dequantized bf16 copy for
steps of `DENSE_FROM_ROWS` rows or more.

A Q8_0 LM head (here the tied embedding) has no int8 kernel with per-32 scales to go to (torch's
`_weight_int8pack_mm` takes one scale per row, and was no faster than the bf16 GEMV anyway), but it
splits exactly into two int4 matrices: with u = q + 128 = 16 hi + lo, d q = [16d (hi - 8) + 8d] +
[d (lo - 8)], so the int4 kernel runs it from 9 bits per weight instead of 16 (`SplitQ8Weight`; one-row
steps: 3.8 vs 4.6 ms on one thread, 1.7 vs 2.2 on two). Its d rounds to bf16 like the Q4 scales; the
two halves' outputs round to bf16 before they are added (3 roundings of the logits instead of 1).
Steps of more rows use the dense table the embedding keeps anyway (a Q4_0/Q4_1 LM head or tied
embedding is packed like the layers, with that table as its dense copy). Every other quantized type is
dequantized to the compute dtype. `LOCALCHAT_TORCH_QUANT` picks the mode: `auto` (int4 for Q4_0/Q4_1
and our kernels' blocks for the rest, with dense copies if they fit in RAM, except for block matrices
on AVX-512 VNNI), `copies` (dense copies for every quantized matrix), `int4` (never a dense copy: least
memory) or `dequant` (all dense, the reference path).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial

import numpy as np
import torch
import torch.nn.functional as F

from localchat.backends.torch.cpu import isq as isq_blocks
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix, Segment
from localchat.backends.torch.cuda.quant_cuda import (
    Int4CudaWeight,
    cuda_int4_linear,
    dequantize_q4,
    inner_k_tiles,
    pack_cuda,
    pack_triton,
    quantize_q4,
)
from localchat.backends.torch.cuda.triton_int4_weight import TritonInt4Weight

# The policy's names, also importable from here as before (quant_policy.py)
from localchat.backends.torch.quant_policy import ACTIVATION_MODES as ACTIVATION_MODES
from localchat.backends.torch.quant_policy import ACTIVATIONS_ENV as ACTIVATIONS_ENV
from localchat.backends.torch.quant_policy import DENSE_COPY_RAM_FRACTION as DENSE_COPY_RAM_FRACTION
from localchat.backends.torch.quant_policy import FAST_GEMM_ISAS as FAST_GEMM_ISAS
from localchat.backends.torch.quant_policy import QUANT_ENV, QuantPolicy
from localchat.backends.torch.quant_policy import QUANT_MODES as QUANT_MODES
from localchat.backends.torch.quant_policy import SMALL_MODEL_BYTES as SMALL_MODEL_BYTES
from localchat.backends.torch.quant_policy import int4_kernel_available as int4_kernel_available
from localchat.backends.torch.quant_policy import pick_policy as pick_policy
from localchat.weights.hf_quant_blocks import RepackedLinear
from localchat.weights.page_release import release_rows
from localchat.weights.tensors import WeightTensor

log = logging.getLogger(__name__)

INT4_TYPES = ("Q4_0", "Q4_1")
GROUP_SIZE = 32
# Rows from which the dense copy is used: the int4 kernel ties a dense GEMM at 16-32 rows (1-2 threads).
DENSE_FROM_ROWS = 24
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}
# Rows packed per converter call: slices made of whole row tiles of the layout (64 rows today) pack to
# the same bytes as one call (test_torch_quant.py checks).
PACK_ROWS = 4096


@dataclass(slots=True)
class Int4Weight:
    """A linear's matrix `[out, in]` in torch's CPU int4 layout (group 32)."""

    packed: torch.Tensor  # uint8 [out, in / 2], `_convert_weight_to_int4pack_for_cpu`'s layout
    scale_zeros: torch.Tensor  # [in / 32, out, 2] compute dtype; w = (q - 8) * scale + zero
    dense: torch.Tensor | None  # [out, in] compute dtype, for steps of DENSE_FROM_ROWS rows or more

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)


@dataclass(slots=True)
class Int4Parts:
    """Load-time form, before packing: fused matrices (q|k|v, gate|up) concatenate these."""

    codes: torch.Tensor  # uint8 [out, in], 0..15
    scale: torch.Tensor  # float32 [out, in / 32]
    zero: torch.Tensor  # float32 [out, in / 32]
    sources: list[WeightTensor]  # for the dense copy, dequantized exactly as the dense path does

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])


@dataclass(slots=True)
class SplitQ8Weight:
    """A Q8_0 matrix `[out, in]` as the sum of two int4 matrices (module docstring), for one-row steps."""

    high: Int4Weight  # 16d (hi - 8) + 8d
    low: Int4Weight  # d (lo - 8)
    dense: torch.Tensor  # [out, in] compute dtype (the embedding table when tied)

    @property
    def shape(self) -> tuple[int, int]:
        return self.high.shape


@dataclass(slots=True)
class PermutedWeight:
    """A block matrix stored with its input columns reordered (GPTQ act-order, weights/hf_quant_blocks.py):
    `linear` reorders the activations to match, one index_select per call."""

    order: torch.Tensor  # int64 [in]: stored column j multiplies input column order[j]
    matrix: BlockMatrix
    dtype: torch.dtype  # the compute dtype, for a dense form when fused with a differently ordered part

    @property
    def shape(self) -> tuple[int, int]:
        return self.matrix.shape


Loaded = torch.Tensor | Int4Parts | BlockMatrix | PermutedWeight  # what `convert` returns
Weight = (
    torch.Tensor
    | Int4Weight
    | SplitQ8Weight
    | Int4CudaWeight
    | TritonInt4Weight
    | BlockMatrix
    | PermutedWeight
)  # what `linear` takes


def convert(weight: WeightTensor, dtype: torch.dtype, device: torch.device, policy: QuantPolicy) -> Loaded:
    """A weight in its runtime form: GGUF blocks for our kernels, `Int4Parts` where torch's int4 kernel
    applies, else a dense tensor."""
    if isinstance(weight, RepackedLinear):
        return _repacked(weight, dtype, device, policy)
    rows = weight.shape[0] if len(weight.shape) == 2 else 0
    cols = weight.shape[1] if rows else 0
    packable = rows % 16 == 0 and rows > 0 and (not policy.cuda or inner_k_tiles(cols) is not None)
    if policy.kernels is not None and rows and cpu_kernels.supports(weight.dtype, cols):
        ops = policy.kernels
        if ops.x16_layout() and ops.can_repack(weight.dtype, cols):
            # packed straight from the mapped file: no private copy of the blocks beside the panels (the
            # tied Q8_0 head of a 1B model is 279 MiB, an 8B's Q6_K output 431 MiB)
            view = np.ascontiguousarray(np.asarray(weight.data, dtype=np.uint8).reshape(rows, -1))
            packed = ops.pack_rows(
                weight.dtype, view.ctypes.data, rows, view.shape[1], cols, partial(release_rows, view)
            )
            return BlockMatrix([packed], cols, ops)
        # a private copy of the file's blocks: the loader drops the file's pages once consumed
        blocks = torch.from_numpy(np.array(weight.data, dtype=np.uint8).reshape(rows, -1))
        return BlockMatrix([Segment(weight.dtype, blocks)], cols, ops)
    if policy.int4 and weight.dtype in INT4_TYPES and packable:
        return _int4_parts(weight)
    head = weight.name.endswith(("lm_head.weight", "embed_tokens.weight"))
    qtype = isq_blocks.block_type(policy.isq_blocks, weight, head) if policy.isq_blocks else None
    if qtype is not None and policy.kernels is not None:
        return isq_blocks.quantize_weight(weight, qtype, policy.kernels)
    # NOTE: --isq leaves the LM head dense: a 4-bit output layer costs the most quality (llama.cpp keeps
    # it at 6-8 bits too).
    isq = policy.isq and not weight.is_quantized and not weight.name.endswith("lm_head.weight")
    if isq and packable and cols % GROUP_SIZE == 0:
        codes, scale, zero = quantize_q4(to_tensor(weight, torch.float32, torch.device("cpu")))
        return Int4Parts(codes, scale, zero, [])  # no sources: its dense copy comes from the codes
    return to_tensor(weight, dtype, device)


def _repacked(
    weight: RepackedLinear, dtype: torch.dtype, device: torch.device, policy: QuantPolicy
) -> Loaded:
    """A GPTQ / AWQ / compressed-tensors int4 linear: its blocks on our kernels, else (no kernels, CUDA,
    `dequant`) its exact values densely, as before the repack."""
    if policy.kernels is None or not cpu_kernels.supports(weight.qtype, weight.shape[1]):
        _log_dense_int4()
        return to_tensor(WeightTensor(weight.name, weight.shape, "F32", weight.dequantize()), dtype, device)
    matrix = convert(weight.blocks(), dtype, device, policy)  # FP8's Q8_0 is made here (hf_q8_blocks.py)
    if weight.order is None or not isinstance(matrix, BlockMatrix):
        return matrix
    return PermutedWeight(torch.from_numpy(weight.order), matrix, dtype)


@cache
def _log_dense_int4() -> None:
    log.info(
        "GPTQ/AWQ/compressed-tensors int4 linears are dequantized to the compute dtype (FP8 / int8 ones "
        "and GGUF matrices stored with moved columns too): localchat's CPU kernels do not run this load "
        "(%s off or not built, another device, or %s=dequant)",
        cpu_kernels.KERNELS_ENV,
        QUANT_ENV,
    )


def fuse(parts: list[Loaded]) -> Loaded:
    """Stack matrices along `out` (q|k|v, gate|up); dense as soon as one part is dense."""
    if any(isinstance(p, PermutedWeight) for p in parts):
        return _fuse_permuted(parts)
    if all(isinstance(p, BlockMatrix) for p in parts):
        blocks = [p for p in parts if isinstance(p, BlockMatrix)]
        return BlockMatrix(cpu_kernels.merge_segments(blocks), blocks[0].cols, blocks[0].ops)
    if all(isinstance(p, Int4Parts) for p in parts):
        int4 = [p for p in parts if isinstance(p, Int4Parts)]
        return Int4Parts(
            torch.cat([p.codes for p in int4]),
            torch.cat([p.scale for p in int4]),
            torch.cat([p.zero for p in int4]),
            [s for p in int4 for s in p.sources],
        )
    dense = [p for p in parts if isinstance(p, torch.Tensor)]
    like = dense[0]
    return torch.cat(
        [p if isinstance(p, torch.Tensor) else _dense(p, like.dtype, like.device) for p in parts]
    )


def _fuse_permuted(parts: list[Loaded]) -> Loaded:
    """Act-order parts (q|k|v, gate|up share their input, so GPTQ gives them one order) stay blocks under
    that order; parts in different orders, or beside plain ones, become one dense matrix."""
    permuted = [p for p in parts if isinstance(p, PermutedWeight)]
    first = permuted[0]
    if len(permuted) == len(parts) and all(torch.equal(p.order, first.order) for p in permuted):
        merged = fuse([p.matrix for p in permuted])
        assert isinstance(merged, BlockMatrix)
        return PermutedWeight(first.order, merged, first.dtype)
    dense = [p if isinstance(p, torch.Tensor) else _dense(p, first.dtype, torch.device("cpu")) for p in parts]
    return torch.cat(dense)


def finalize(loaded: Loaded, dtype: torch.dtype, device: torch.device, policy: QuantPolicy) -> Weight:
    if isinstance(loaded, PermutedWeight):
        matrix = finalize(loaded.matrix, dtype, device, policy)
        assert isinstance(matrix, BlockMatrix)
        loaded.matrix = matrix
        return loaded
    if isinstance(loaded, BlockMatrix):
        if loaded.ops.x16_layout():  # what `convert` did not pack (--isq blocks)
            loaded.segments = [loaded.ops.repack(s, loaded.cols) for s in loaded.segments]
            loaded.call_args = None
        if policy.block_copies:
            loaded.dense = _dense(loaded, dtype, device)
        return loaded
    if isinstance(loaded, torch.Tensor):
        return loaded
    if policy.cuda:
        if policy.cuda_kernel == "triton":
            return pack_triton(loaded.codes, loaded.scale, loaded.zero, device)
        packed_cuda = pack_cuda(loaded.codes, loaded.scale, loaded.zero, device)
        if policy.cuda_kernel == "both":
            packed_cuda.many_rows = pack_triton(loaded.codes, loaded.scale, loaded.zero, device)
        return packed_cuda
    rows, cols = loaded.shape
    packed = _pack(rows, cols, lambda start, end: loaded.codes[start:end])
    dense = _dense(loaded, dtype, device) if policy.dense_copy else None
    return Int4Weight(packed.to(device), _scale_zeros(loaded.scale, loaded.zero, dtype).to(device), dense)


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ weight [out, in].T (+ bias) -> [T, out]."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    if isinstance(weight, PermutedWeight):
        return linear(x.index_select(-1, weight.order), weight.matrix, bias)
    if isinstance(weight, BlockMatrix):
        if weight.dense is not None and x.shape[0] >= DENSE_FROM_ROWS:
            return F.linear(x, weight.dense, bias)
        out = weight.ops.matmul(x, weight)
        return out if bias is None else out + bias
    if isinstance(weight, Int4CudaWeight | TritonInt4Weight):
        out = cuda_int4_linear(x, weight)
        return out if bias is None else out + bias
    if isinstance(weight, SplitQ8Weight):
        if x.shape[0] > 1:  # measured faster only for one row: the kernel is compute-bound
            return F.linear(x, weight.dense, bias)
        return linear(x, weight.high, bias) + linear(x, weight.low)
    if weight.dense is not None and x.shape[0] >= DENSE_FROM_ROWS:
        return F.linear(x, weight.dense, bias)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight.packed, GROUP_SIZE, weight.scale_zeros)
    return out if bias is None else out + bias


def embed_rows(ids: torch.Tensor, table: torch.Tensor | BlockMatrix, dtype: torch.dtype) -> torch.Tensor:
    """The embedding rows of token `ids` [T] -> [T, hidden], from a dense or a block table."""
    if isinstance(table, torch.Tensor):
        return F.embedding(ids, table)
    if len(table.segments) == 1:
        return table.ops.dequantize_rows(table.segments[0], table.cols, ids, dtype)
    out = torch.empty(ids.numel(), table.cols, dtype=dtype)
    first = 0
    for seg in table.segments:  # an embedding is one segment; the loop keeps the general form correct
        mine = (ids >= first) & (ids < first + seg.rows)
        if bool(mine.any()):
            out[mine] = table.ops.dequantize_rows(seg, table.cols, ids[mine] - first, dtype)
        first += seg.rows
    return out


def to_tensor(weight: WeightTensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh tensor (never aliasing the memory-mapped file) of `weight.shape` in `dtype` on `device`."""
    if weight.is_quantized and weight.shape[0] > PACK_ROWS:
        # Row slices: dequantizing a 49152-row embedding at once takes ~300 MB of float32 temporaries.
        out = torch.empty(weight.shape, dtype=dtype, device=device)
        for start in range(0, weight.shape[0], PACK_ROWS):
            rows = weight.data[start : start + PACK_ROWS]
            part = WeightTensor(weight.name, (rows.shape[0], *weight.shape[1:]), weight.dtype, rows)
            out[start : start + rows.shape[0]] = to_tensor(part, dtype, device)
        return out
    if weight.is_quantized:
        array = weight.dequantize()
    elif weight.dtype == "BF16":
        array = np.ascontiguousarray(weight.data).view(np.int16)
    else:
        array = np.ascontiguousarray(weight.data)
    with warnings.catch_warnings():
        # Memory-mapped arrays are read-only; we copy right below, so torch's warning does not apply.
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    if weight.dtype == "BF16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.reshape(weight.shape).to(device=device, dtype=dtype, copy=True)


def pack_head(
    weight: WeightTensor, dense: torch.Tensor, dtype: torch.dtype
) -> Int4Weight | SplitQ8Weight | None:
    """The packed form of an LM head whose `dense` table is kept anyway (None: no kernel for it)."""
    if weight.dtype == "Q8_0":
        return split_q8(weight, dense, dtype)
    if weight.dtype not in INT4_TYPES or weight.shape[0] % 16 or dense.device.type != "cpu":
        return None
    rule = QuantPolicy(int4=True)
    head = finalize(_int4_parts(weight), dtype, dense.device, rule)
    assert isinstance(head, Int4Weight)
    head.dense = dense  # shared with the embedding: no second copy
    return head


def split_q8(weight: WeightTensor, dense: torch.Tensor, dtype: torch.dtype) -> SplitQ8Weight | None:
    """A Q8_0 matrix as two int4 ones (None where the kernel cannot take it); `dense`: its bf16 form."""
    out, cols = weight.shape
    if weight.dtype != "Q8_0" or out % 16 or dense.device.type != "cpu":
        return None
    raw = weight.data.reshape(out, cols // GROUP_SIZE, 34)  # [out, groups, 34], still the mapped file
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0]).float()  # [out, groups]

    def biased(start: int, end: int) -> torch.Tensor:  # q + 128 as uint8 (two's complement) [rows, in]
        return torch.from_numpy(raw[start:end, :, 2:] ^ 0x80).reshape(end - start, cols)

    high = Int4Weight(
        _pack(out, cols, lambda a, b: biased(a, b) >> 4), _scale_zeros(16 * d, 8 * d, dtype), None
    )
    low = Int4Weight(_pack(out, cols, lambda a, b: biased(a, b) & 0x0F), _scale_zeros(d, 0 * d, dtype), None)
    return SplitQ8Weight(high, low, dense)


def _scale_zeros(scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[out, groups] each -> [groups, out, 2] in `dtype`, the kernel's qScaleAndZeros."""
    return torch.stack((scale.t(), zero.t()), dim=-1).to(dtype).contiguous()


def _pack(rows: int, cols: int, codes: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """uint8 [rows, cols / 2] in the kernel's layout from `codes(start, end)` (uint8 [end - start, cols],
    values 0..15), a slice of rows at a time: the converter wants int32, 4 bytes per weight."""
    packed = torch.empty(rows, cols // 2, dtype=torch.uint8)
    for start in range(0, rows, PACK_ROWS):
        end = min(start + PACK_ROWS, rows)
        part = codes(start, end).to(torch.int32)
        packed[start:end] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(part, 1)
    return packed


def _dense(
    parts: Int4Parts | BlockMatrix | PermutedWeight, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if isinstance(parts, PermutedWeight):
        stored = _dense(parts.matrix, dtype, device)
        values = torch.empty_like(stored)
        values[:, parts.order.to(device)] = stored
        return values
    if isinstance(parts, BlockMatrix):
        rows = [parts.ops.dequantize_rows(s, parts.cols, torch.arange(s.rows), dtype) for s in parts.segments]
        return torch.cat(rows).to(device)
    if not parts.sources:  # quantized at load (--isq): the copy holds what the int4 kernel computes
        return dequantize_q4(parts.codes, parts.scale, parts.zero).to(device=device, dtype=dtype)
    return torch.cat([to_tensor(s, dtype, device) for s in parts.sources])


def _int4_parts(weight: WeightTensor) -> Int4Parts:
    """GGUF Q4_0 / Q4_1 blocks (uint8 [out, bytes_per_row]) -> codes, scale, zero (table above)."""
    out, cols = weight.shape
    block = _BLOCK_BYTES[weight.dtype]
    raw = np.ascontiguousarray(weight.data).reshape(out, cols // GROUP_SIZE, block)  # [out, groups, bytes]
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0]).float()  # [out, groups]
    if weight.dtype == "Q4_1":
        m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0]).float()
        zero = m + 8 * d
    else:
        zero = torch.zeros_like(d)
    nibbles = torch.from_numpy(raw[..., block - 16 :].copy())  # [out, groups, 16]
    # Value j of a block is the low nibble of byte j, value j + 16 its high nibble.
    codes = torch.cat((nibbles & 0x0F, nibbles >> 4), dim=-1).reshape(out, cols)
    return Int4Parts(codes, d, zero, [weight])
