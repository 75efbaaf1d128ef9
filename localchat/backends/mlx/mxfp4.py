"""MXFP4 expert matrices kept packed on MLX, in its own "mxfp4" quantization (gpt-oss's experts).

Both checkpoint forms hold the same numbers as MLX's mxfp4: 4-bit e2m1 codes (sign, 2 exponent bits,
1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6) times one e8m0 power of two (2^(e - 127)) per 32 inputs.

| source | per 32 inputs | nibble order |
|---|---|---|
| the hub's safetensors (`*_blocks` [E, out, G, 16] + `*_scales` [E, out, G]) | 16 code bytes; the scale apart | value 2k low, 2k + 1 high in byte k: MLX's own |
| llama.cpp's GGUF MXFP4 block (17 bytes) | e8m0 byte, then 16 code bytes | value j low, j + 16 high in byte j (as Q4_0), reshuffled here |

GGML's table holds doubled values (0, 1, 2, ... 12) against a halved scale (2^(e - 128)): the same
products. MLX reads 8 codes per uint32 word, low nibble first, so the code bytes viewed as little-endian
words are its packed matrix and the scale bytes its scales.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

GROUP = 32  # inputs per e8m0 scale
GGML_BLOCK_BYTES = 1 + GROUP // 2


@dataclass(slots=True)
class Mxfp4Stack:
    """Every expert's matrix [out, in] in MLX's mxfp4 layout."""

    packed: mx.array  # uint32 [experts, out, in / 8]: 8 e2m1 codes per word, low nibble first
    scales: mx.array  # uint8 [experts, out, in / 32]: e8m0 exponents

    @property
    def shape(self) -> tuple[int, int, int]:
        experts, out, words = self.packed.shape
        return experts, out, words * 8


def stack(codes: np.ndarray, exponents: np.ndarray) -> Mxfp4Stack:
    """codes uint8 [experts, out, G, 16] in MLX's nibble order, exponents uint8 [experts, out, G]."""
    assert sys.byteorder == "little", "the uint32 view below assumes little-endian words"
    experts, out = codes.shape[:2]
    words = np.ascontiguousarray(codes, dtype=np.uint8).reshape(experts, out, -1).view(np.uint32)
    result = Mxfp4Stack(mx.array(words), mx.array(np.ascontiguousarray(exponents, dtype=np.uint8)))
    mx.eval(result.packed, result.scales)
    return result


def from_ggml(data: np.ndarray, experts: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """A GGUF MXFP4 tensor's rows of blocks uint8 [experts * out, G * 17] -> (codes [experts, out, G, 16]
    in MLX's nibble order, exponents [experts, out, G])."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(experts, out, -1, GGML_BLOCK_BYTES)
    exponents = blocks[..., 0]
    packed = blocks[..., 1:]
    values = np.concatenate((packed & 0x0F, packed >> 4), axis=-1)  # [..., 32] in input order
    pairs = values.reshape(*values.shape[:-1], GROUP // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8), exponents


def gather(x: mx.array, w: Mxfp4Stack, ids: mx.array, is_sorted: bool) -> mx.array:
    """`mx.gather_mm` over the experts `ids` picks, the matrices used as [out, in]."""
    return mx.gather_qmm(
        x,
        w.packed,
        w.scales,
        None,
        rhs_indices=ids,
        transpose=True,
        group_size=GROUP,
        bits=4,
        mode="mxfp4",
        sorted_indices=is_sorted,
    )
