"""GGUF NVFP4, MXFP4, Q1_0 and Q2_0 matrices (localchat/weights/lowbit.py, mxfp4.py have the formats) in
MLX's own quantization, each kept exactly, the file's code bits reused as they lie:

| GGUF block | MLX form | codes | scale | bias |
|---|---|---|---|---|
| NVFP4: 4 ue4m3 bytes, 32 bytes of e2m1 codes per 64 | mode "nvfp4", groups of 16 | nibbles reordered to value 2k low, 2k + 1 high | the ue4m3 byte as MLX's e4m3 | none |
| MXFP4: e8m0 byte, 16 bytes of e2m1 codes per 32 | mode "mxfp4", groups of 32 | nibbles reordered (backends/mlx/mxfp4.py) | the e8m0 byte | none |
| Q1_0: f16 d, 128 sign bits | affine, 1 bit, groups of 128 | the bit bytes as uint32 words | 2 d | -d |
| Q2_0: f16 d, 64 2-bit codes | affine, 2 bits, groups of 64 | the code bytes as uint32 words | d | -d |

NVFP4: ggml's value is table2[code] * ue4m3(s) / 2 with table2 the doubled E2M1 values, MLX's is
E2M1[code] * e4m3(s): the same product. The scale bytes match below 0x7F (bias 7, subnormals m 2^-9);
ggml reads 0x7F as zero (MLX: NaN) and ignores bit 7, so 0x7F becomes 0x00 and 0x80-0xFE their low
7 bits; only 0xFF (ggml: 480 / 2, no e4m3 value) has no MLX form, and a matrix holding it is expanded.
`mx.dequantize` then gives ggml's values in float32, except -0.0 where ggml gives +0.0 (code 8).
MXFP4: ggml's doubled table against a halved e8m0 scale is the same product as MLX's (backends/mlx/mxfp4.py);
every byte maps, 0xFF included (both read 2^128: inf or NaN, as the file's values are).
Q1_0 and Q2_0: MLX packs value i at bit bits * (i % (32 / bits)) of word i / (32 / bits), which is
GGUF's little-endian bit order, and scale * q + bias rounds to exactly ±d / (q - 1) d in float32 (2 d,
3 d and their differences with d are exact for an f16 d). In bfloat16 / float16 the scale and bias round
to the compute dtype, as every MLX affine group's do. Bits a weight in MLX: NVFP4 4.5 (as the file), MXFP4 4.25 (as the file),
Q1_0 1 + 2 x 16 / 128 (1.25 in bf16, 1.5 in float32; 1.125 in the file), Q2_0 2.5 / 3 (2.25).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from localchat.backends.mlx.mxfp4 import from_ggml
from localchat.weights.mlx_groups import LOWBIT_GROUPS
from localchat.weights.tensors import WeightTensor


class LowbitArrays(NamedTuple):
    """What quant.QuantizedWeight holds (this module sits below it)."""

    packed: mx.array  # uint32 [out, in * bits / 32]
    scales: mx.array  # [out, in / group]: the compute dtype, or uint8 (e4m3 for nvfp4, e8m0 for mxfp4)
    biases: mx.array | None  # [out, in / group], None for nvfp4
    bits: int
    group_size: int
    mode: str  # "affine" | "nvfp4" | "mxfp4"


def lowbit_arrays(weight: WeightTensor, dtype: mx.Dtype) -> LowbitArrays | None:
    """A NVFP4 / MXFP4 / Q1_0 / Q2_0 matrix [out, in] in MLX's form, or None where it has none (an NVFP4 scale
    byte 0xFF) and the caller expands it."""
    assert sys.byteorder == "little", "the uint32 views below assume little-endian words"
    rows = weight.shape[0]
    bits, group = LOWBIT_GROUPS[weight.dtype]
    data = np.ascontiguousarray(weight.data, dtype=np.uint8)
    if weight.dtype == "NVFP4":
        blocks = data.reshape(rows, -1, 36)
        scales = blocks[..., :4]
        if (scales == 0xFF).any():
            return None
        codes = blocks[..., 4:].reshape(rows, -1, 4, 8)
        values = np.concatenate((codes & 15, codes >> 4), axis=-1)  # [rows, blocks, 4, 16] in input order
        pairs = values.reshape(rows, -1, 2)
        packed = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8).reshape(rows, -1)
        e4m3 = np.where(scales == 0x7F, 0, scales & 0x7F).astype(np.uint8).reshape(rows, -1)
        return LowbitArrays(mx.array(packed.view(np.uint32)), mx.array(e4m3), None, bits, group, "nvfp4")
    if weight.dtype == "MXFP4":
        codes, exponents = from_ggml(data, 1, rows)  # [1, rows, G, 16] in MLX's nibble order, [1, rows, G]
        packed = np.ascontiguousarray(codes).reshape(rows, -1).view(np.uint32)
        return LowbitArrays(mx.array(packed), mx.array(exponents[0]), None, bits, group, "mxfp4")
    blocks = data.reshape(rows, -1, 18)
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, blocks]
    packed = np.ascontiguousarray(blocks[..., 2:]).reshape(rows, -1).view(np.uint32)
    scale = 2 * d if weight.dtype == "Q1_0" else d
    return LowbitArrays(
        mx.array(packed), mx.array(scale).astype(dtype), mx.array(-d).astype(dtype), bits, group, "affine"
    )
