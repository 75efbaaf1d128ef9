"""Turning a loader's `WeightTensor` into MLX arrays: the one place that knows about quantization.

GGUF Q4_0, Q4_1 and Q8_0 keep their bits: each 32-value GGUF block becomes one MLX affine group
(`w = scale * q + bias`, group 32, `mx.quantize`'s packing), converted on the integers, never through
floats. So do Q5_0, Q5_1, Q4_K and Q5_K (localchat/backends/mlx/gguf_blocks.py: 5- and 4-bit groups whose
scale and bias are GGUF's per-32 sub-block values). Q6_K, Q3_K and Q2_K have scales per 16 values and no
group-32 form: they are re-quantized to min/max groups of 32 (each value within half a step of its group's
range), Q6_K to 8 bits (8.5 bits per weight instead of 6.56), Q3_K to 5 (6 instead of 3.44), Q2_K to 4
(5 instead of 2.63), against 16 dequantized. The i-quants (codebook grids, no affine form) are re-quantized
the same way, each to the fewest bits whose error stays within 5% of the type's own (table at
REQUANTIZED); the ternary TQ1_0 / TQ2_0 ({-d, 0, d}) map exactly onto 2-bit groups (scale d, bias -d).
NVFP4, MXFP4, Q1_0 and Q2_0 map exactly onto MLX's nvfp4 / mxfp4 modes and 1- / 2-bit affine groups of
a block (localchat/backends/mlx/lowbit.py). Expert stacks keep each of these forms (models/moe.py).
Other quantized types are dequantized to the compute dtype. Hugging Face GPTQ / AWQ / compressed-tensors int4 and FP8 / int8 linears arrive as Q4_1 / Q4_0 /
Q8_0 blocks (weights/hf_quant.py; their error against the checkpoint is stated there) and map the same way.

| GGUF block | value | MLX q (unsigned) | scale | bias |
|---|---|---|---|---|
| Q4_0: d f16, 16 bytes of nibbles | d * (q - 8) | q (4 bits) | d | -8 d |
| Q4_1: d f16, m f16, 16 bytes of nibbles | d * q + m | q (4 bits) | d | m |
| Q8_0: d f16, 32 int8 | d * q | q + 128 (8 bits) | d | -128 d |

MLX's packing: value i of a row sits at bit `bits * (i % (32 / bits))` of uint32 word `i // (32 / bits)`
(little-endian order), so 8-bit rows are the bytes themselves and 4-bit rows put two values per byte,
low nibble first. GGUF's 4-bit blocks instead put value j in the low nibble of byte j and value j + 16
in its high nibble, hence the nibble shuffle below.

Exactness: d, m are float16 and q has at most 8 bits, so `d * q`, `-8 d`, `-128 d` are exact in float32
and `scale * q + bias` rounds exactly where GGUF's own formula does: `mx.dequantize` equals gguf's
dequantizer value for value in float32, the one bit-level difference being +0.0 where Q4_0 gives -0.0
(q = 8, d < 0) (tests/backends/test_mlx_quant.py). With float16 scales (Metal) the same holds unless
`128 * d` overflows float16 (|d| > 511).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from localchat.backends.mlx.gguf_blocks import EXACT_TYPES, decode_affine, pack_codes
from localchat.backends.mlx.lowbit import lowbit_arrays
from localchat.weights.hf_quant_blocks import RepackedLinear
from localchat.weights.mlx_groups import GROUP_SIZE, LOWBIT_GROUPS, REQUANTIZED
from localchat.weights.tensors import WeightTensor

NATIVE_TYPES = ("Q4_0", "Q4_1", "Q8_0", *EXACT_TYPES)
# REQUANTIZED: the bits each type without an exact MLX form is re-quantized to, and why those
# (localchat/weights/mlx_groups.py, where the RAM estimate reads it too).
# values d (t - 1), t in 0..2 (TQ2_0's 2-bit field also admits 3): 2-bit codes t, scale d, bias -d, exactly.
# (byte offset of the fp16 d in the 256-value block, block bytes)
TERNARY = {"TQ1_0": (52, 54), "TQ2_0": (64, 66)}
# GGUF type -> (bytes per 32-value block, bits per value in MLX).
_BLOCKS = {"Q4_0": (18, 4), "Q4_1": (20, 4), "Q8_0": (34, 8)}


@dataclass(slots=True)
class QuantizedWeight:
    """A matrix `[out, in]` in MLX affine group quantization."""

    packed: mx.array  # uint32 [out, in * bits / 32]
    scales: mx.array  # [out, in / group_size], the compute dtype (uint8 e4m3 / e8m0 in "nvfp4" / "mxfp4")
    biases: mx.array | None  # [out, in / group_size]; None in mode "nvfp4"
    bits: int
    group_size: int = GROUP_SIZE
    # Steps with at least this many rows dequantize the matrix for a dense GEMM (0: never); see `linear`.
    dense_from_rows: int = 0
    mode: str = "affine"  # or "nvfp4" / "mxfp4" (GGUF NVFP4 / MXFP4, backends/mlx/lowbit.py)
    # The dense values' dtype where the scales do not give it (nvfp4's are uint8 e4m3); None: the scales'.
    dtype: mx.Dtype | None = None

    def dequantized(self) -> mx.array:
        """The matrix [out, in] as dense values."""
        return mx.dequantize(
            self.packed,
            self.scales,
            self.biases,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
            dtype=self.dtype or self.scales.dtype,
        )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 32 // self.bits)


@dataclass(slots=True)
class DenseWeight:
    """A dense matrix `[out, in]`, stored transposed: `[in, out]`, contiguous.

    MLX's CPU GEMM runs `x @ wt` about twice as fast as `x @ w.T` on a transposed view (measured on the
    dev box: 188 vs 367 ms for [480, 576] @ [576, 1536]); on Metal both layouts run alike.
    """

    wt: mx.array  # [in, out]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.wt.shape[1], self.wt.shape[0])


Weight = DenseWeight | QuantizedWeight  # a linear layer's matrix
Embedding = mx.array | QuantizedWeight  # [vocab, hidden], looked up by rows (and the tied LM head)


def gguf_blocks_to_affine(dtype: str, data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """GGUF blocks uint8 [rows, bytes_per_row] -> (packed uint32, scales f32, biases f32, bits)."""
    assert sys.byteorder == "little", "the uint32 views below assume little-endian packing"
    if dtype in EXACT_TYPES:
        codes, scales, biases, bits = decode_affine(dtype, data)
        return pack_codes(codes, bits), scales, biases, bits
    block_bytes, bits = _BLOCKS[dtype]
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(rows, -1, block_bytes)  # [rows, groups, block_bytes]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, groups]
    if dtype == "Q8_0":
        # int8 -> unsigned by flipping the sign bit (q + 128); bytes are already MLX's 8-bit order.
        q = blocks[..., 2:] ^ np.uint8(0x80)  # [rows, groups, 32]
        return np.ascontiguousarray(q).view(np.uint32).reshape(rows, -1), d, -128.0 * d, bits
    start = 4 if dtype == "Q4_1" else 2
    nibbles = blocks[..., start:]  # [rows, groups, 16]
    values = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)  # [rows, groups, 32], GGUF order
    pairs = values.reshape(rows, values.shape[1], 16, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)  # value 2k low, 2k+1 high
    if dtype == "Q4_1":
        bias = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    else:
        bias = -8.0 * d
    return np.ascontiguousarray(packed).view(np.uint32).reshape(rows, -1), d, bias, bits


def _as_blocks(weight: WeightTensor) -> WeightTensor:
    """A Hugging Face GPTQ / AWQ / compressed-tensors / FP8 linear handed over as GGUF blocks
    (weights/hf_quant.py) as those blocks: Q4_1 / Q4_0 / Q8_0, all native here. Act-order ones (columns
    reordered) stay as they are, dequantized exactly."""
    if isinstance(weight, RepackedLinear) and weight.order is None:
        return weight.blocks()
    return weight


def to_weight(weight: WeightTensor, dtype: mx.Dtype, dense_from_rows: int = 0) -> Weight:
    """A linear layer's matrix, never aliasing the memory-mapped file: quantized where MLX can."""
    weight = _as_blocks(weight)
    if weight.dtype in NATIVE_TYPES:
        return _to_quantized(weight, dtype, dense_from_rows)
    if weight.dtype in REQUANTIZED and weight.shape[-1] % GROUP_SIZE == 0:
        return _requantized(weight, dtype, dense_from_rows)
    if weight.dtype in LOWBIT_GROUPS and (arrays := lowbit_arrays(weight, dtype)) is not None:
        return QuantizedWeight(*arrays[:5], dense_from_rows=dense_from_rows, mode=arrays.mode, dtype=dtype)
    return DenseWeight(mx.contiguous(to_dense(weight, dtype).T))


def to_embedding(weight: WeightTensor, dtype: mx.Dtype, dense_from_rows: int = 0) -> Embedding:
    weight = _as_blocks(weight)
    if weight.dtype in NATIVE_TYPES:
        return _to_quantized(weight, dtype, dense_from_rows)
    if weight.dtype in REQUANTIZED and weight.shape[-1] % GROUP_SIZE == 0:
        return _requantized(weight, dtype, dense_from_rows)
    if weight.dtype in LOWBIT_GROUPS and (arrays := lowbit_arrays(weight, dtype)) is not None:
        return QuantizedWeight(*arrays[:5], dense_from_rows=dense_from_rows, mode=arrays.mode, dtype=dtype)
    return to_dense(weight, dtype)


def _to_quantized(weight: WeightTensor, dtype: mx.Dtype, dense_from_rows: int) -> QuantizedWeight:
    packed, scales, biases, bits = gguf_blocks_to_affine(weight.dtype, weight.data)
    scales_mx, biases_mx = mx.array(scales).astype(dtype), mx.array(biases).astype(dtype)
    return QuantizedWeight(mx.array(packed), scales_mx, biases_mx, bits, dense_from_rows=dense_from_rows)


def _requantized(weight: WeightTensor, dtype: mx.Dtype, dense_from_rows: int) -> QuantizedWeight:
    """Min/max affine groups of 32 over the dequantized values: every value within half a step of its
    group's range (mx.quantize's own choice of scale and bias errs up to twice that)."""
    bits = REQUANTIZED[weight.dtype]
    values = weight.dequantize().astype(np.float32)
    groups = values.reshape(values.shape[0], -1, GROUP_SIZE)
    if weight.dtype in TERNARY:  # min/max would put 0 between two levels: scale d, bias -d instead
        scale = np.repeat(_ternary_scales(weight), 256 // GROUP_SIZE, axis=1)
        low = -scale
    else:
        low, high = groups.min(-1), groups.max(-1)
        scale = (high - low) / np.float32(2**bits - 1)
    safe = np.where(scale != 0, scale, np.float32(1))  # a ternary d may be negative
    codes = np.clip(np.rint((groups - low[..., None]) / safe[..., None]), 0, 2**bits - 1).astype(np.uint8)
    packed = pack_codes(codes.reshape(values.shape[0], -1), bits)
    return QuantizedWeight(
        mx.array(packed),
        mx.array(scale).astype(dtype),
        mx.array(low).astype(dtype),
        bits,
        dense_from_rows=dense_from_rows,
    )


def _ternary_scales(weight: WeightTensor) -> np.ndarray:
    """TQ1_0 / TQ2_0: each 256-value block's d, float32 [rows, blocks]."""
    at, size = TERNARY[weight.dtype]
    blocks = np.ascontiguousarray(weight.data).reshape(weight.shape[0], -1, size)
    return blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def to_dense(weight: WeightTensor, dtype: mx.Dtype) -> mx.array:
    """Values in `weight.shape` and `dtype`; other quantized types are dequantized here."""
    if weight.is_quantized:
        return mx.array(weight.dequantize()).astype(dtype)
    if weight.dtype == "BF16":
        array = mx.array(np.ascontiguousarray(weight.data, dtype=np.uint16)).view(mx.bfloat16)
    else:
        array = mx.array(np.ascontiguousarray(weight.data))
    return array.reshape(weight.shape).astype(dtype)


def linear(x: mx.array, weight: Weight | Embedding, bias: mx.array | None = None) -> mx.array:
    """x [..., in] times the matrix [out, in] (+ bias) -> [..., out]."""
    if isinstance(weight, QuantizedWeight) and 0 < weight.dense_from_rows <= x.size // x.shape[-1]:
        # MLX's CPU quantized matmul costs the same per row at any batch size; for many rows a
        # transient dense copy is faster (localchat/backends/mlx/runner.py has the numbers).
        y = x @ mx.contiguous(weight.dequantized().T)
    elif isinstance(weight, QuantizedWeight):
        y = mx.quantized_matmul(
            x,
            weight.packed,
            weight.scales,
            weight.biases,
            transpose=True,
            group_size=weight.group_size,
            bits=weight.bits,
            mode=weight.mode,
        )
    elif isinstance(weight, DenseWeight):
        y = x @ weight.wt
    else:
        y = x @ weight.T  # a dense embedding serving as the tied LM head
    return y if bias is None else y + bias


def take_rows(weight: Embedding, ids: mx.array) -> mx.array:
    """Rows `ids` of the matrix as dense values [len(ids), in]: the embedding lookup."""
    if isinstance(weight, QuantizedWeight):
        return mx.dequantize(
            weight.packed[ids],
            weight.scales[ids],
            None if weight.biases is None else weight.biases[ids],
            group_size=weight.group_size,
            bits=weight.bits,
            mode=weight.mode,
            dtype=weight.dtype or weight.scales.dtype,
        )
    return weight[ids]


def concat_rows(parts: list[Weight]) -> Weight | None:
    """Stack matrices along the output dim (q|k|v, gate|up), or None when their formats differ."""
    if all(isinstance(p, DenseWeight) for p in parts):
        return DenseWeight(mx.concatenate([p.wt for p in parts], axis=1))  # type: ignore[union-attr]
    if not all(isinstance(p, QuantizedWeight) for p in parts):
        return None
    quantized: list[QuantizedWeight] = parts  # type: ignore[assignment]
    if len({(p.bits, p.group_size, p.mode) for p in quantized}) != 1:
        return None
    biases = [p.biases for p in quantized if p.biases is not None]
    return QuantizedWeight(
        mx.concatenate([p.packed for p in quantized]),
        mx.concatenate([p.scales for p in quantized]),
        mx.concatenate(biases) if biases else None,
        quantized[0].bits,
        quantized[0].group_size,
        quantized[0].dense_from_rows,
        quantized[0].mode,
        quantized[0].dtype,
    )
