"""GGUF Q5_0 / Q5_1 / Q4_K / Q5_K blocks decoded into MLX affine groups of 32, exactly.

Each decoder returns the unsigned codes per value and one (scale, bias) per 32 values such that
`scale * q + bias` is GGUF's own value: Q5_0 `d * (q - 16)`, Q5_1 `d * q + m`, and for the K-quants
`d * sc * q - dmin * m` per 32-value sub-block (6-bit sc and m, float16 d and dmin: every product is
exact in float32). Q6_K's 16-value sub-blocks have no group-32 form: quant.py re-quantizes it.

Byte layouts (ggml's block structs):
- Q5_0: d f16 | qh u32 (bit j = high bit of value j) | 16 bytes: value j low nibble, j + 16 high nibble.
- Q5_1: d f16 | m f16 | qh u32 | 16 bytes as Q5_0.
- Q4_K: d f16 | dmin f16 | 12 bytes of 6-bit scales and mins | 128 bytes: four 64-value chunks, each
  32 bytes holding sub-block 2c in the low nibbles and 2c + 1 in the high nibbles.
- Q5_K: as Q4_K with 32 bytes `qh` before the nibbles: bit 2c (sub-block 2c) and 2c + 1 of byte l give
  value l's fifth bit.
"""

from __future__ import annotations

import numpy as np

from localchat.kernels.blocks import BLOCKS

# GGUF type -> MLX bits (the block geometry is localchat/kernels/blocks.py's).
EXACT_TYPES = {"Q5_0": 5, "Q5_1": 5, "Q4_K": 4, "Q5_K": 5}

Affine = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # codes uint8 [rows, n], scales, biases, bits


def _f16(raw: np.ndarray) -> np.ndarray:
    """uint8 [..., 2] -> float32 [...]."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def decode_affine(dtype: str, data: np.ndarray) -> Affine:
    """uint8 [rows, bytes_per_row] blocks -> codes [rows, values], scales/biases float32 [rows, values / 32]."""
    nbytes, bits = BLOCKS[dtype].size, EXACT_TYPES[dtype]
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(rows, -1, nbytes)
    if dtype in ("Q5_0", "Q5_1"):
        codes, scales, biases = _q5_legacy(blocks, dtype == "Q5_1")
    else:
        codes, scales, biases = _k_quant(blocks, bits)
    return codes.reshape(rows, -1), scales.reshape(rows, -1), biases.reshape(rows, -1), bits


def _q5_legacy(blocks: np.ndarray, has_min: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _f16(blocks[..., 0:2])
    start = 4 if has_min else 2
    qh = np.ascontiguousarray(blocks[..., start : start + 4]).view("<u4")[..., 0]  # [rows, groups]
    nibbles = blocks[..., start + 4 :]  # [rows, groups, 16]
    low = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)  # value j, GGUF order
    high = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    codes = (low | (high.astype(np.uint8) << 4)).astype(np.uint8)
    bias = _f16(blocks[..., 2:4]) if has_min else -16.0 * d
    return codes, d, bias


def _k_quant(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])  # [rows, supers]
    packed = blocks[..., 4:16].astype(np.uint8)  # 12 bytes of 6-bit scales and mins
    sc = np.empty((*packed.shape[:-1], 8), dtype=np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = packed[..., 0:4] & 63
    mn[..., :4] = packed[..., 4:8] & 63
    sc[..., 4:] = (packed[..., 8:12] & 0x0F) | ((packed[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (packed[..., 8:12] >> 4) | ((packed[..., 4:8] >> 6) << 4)
    qs = blocks[..., -128:].reshape(*blocks.shape[:-1], 4, 32)  # [rows, supers, chunk, 32]
    codes = np.stack((qs & 0x0F, qs >> 4), axis=-2)  # [rows, supers, chunk, 2, 32]: sub-block 2c + h
    if bits == 5:
        qh = blocks[..., 16:48]  # [rows, supers, 32]
        shifts = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)  # sub-block 2c + h reads bit 2c + h
        codes = codes | (((qh[..., None, None, :] >> shifts) & 1) << 4)
    scales = d[..., None] * sc.astype(np.float32)  # [rows, supers, 8]
    biases = -(dmin[..., None] * mn.astype(np.float32))
    return codes.astype(np.uint8), scales, biases


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [rows, n] -> MLX's packing, uint32 [rows, n * bits / 32]: value i occupies bits
    [i * bits, (i + 1) * bits) of the row's little-endian bit stream."""
    rows, n = codes.shape
    if bits == 8:
        return np.ascontiguousarray(codes).view(np.uint32).reshape(rows, -1)
    out = np.empty((rows, n * bits // 8), dtype=np.uint8)
    step = max(1, (1 << 22) // max(n, 1))  # rows per chunk: bounds the bit-expansion scratch (~32 MiB)
    for start in range(0, rows, step):
        chunk = codes[start : start + step]
        expanded = (chunk[..., None] >> np.arange(bits, dtype=np.uint8)) & 1  # [r, n, bits]
        out[start : start + step] = np.packbits(
            expanded.reshape(chunk.shape[0], -1), axis=-1, bitorder="little"
        )
    return out.view(np.uint32)
