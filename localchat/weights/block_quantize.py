"""Dense float matrices -> GGUF Q8_0 / Q4_K / Q4_0 / Q5_0 block bytes, for quantizing safetensors weights at load (`--isq`).

The bytes are exactly GGUF's layouts (what `gguf.quants.dequantize` and our kernels read), so a
quantized matrix runs on the same kernels as a downloaded GGUF file's:

- Q8_0, 32 values per 34-byte block: d = amax / 127 as float16, then q = round(x / d) (halves away from
  zero) as int8; value = d * q. Bit-identical to ggml's reference quantizer.
- Q4_K, 256 values per 144-byte block of eight 32-value sub-blocks: float16 d and dmin, a 6-bit scale
  sc and min m per sub-block (12 packed bytes), 4-bit codes; value = d * sc * q - dmin * m. Scales
  and mins are picked from each sub-block's range (no error search like llama.cpp's), rounded up so
  that every value lies inside the representable range: the error is half a step, d * sc / 2.
- Q4_0, 32 values per 18-byte block: d = (the block's largest-magnitude value) / -8 as float16, 4-bit
  codes; value = d * (q - 8). Symmetric, so a block's one-sided half loses a code: coarser than Q4_K.
  Bit-identical to ggml's reference quantizer.
- Q5_0, 32 values per 22-byte block: d = (the block's largest-magnitude value) / -16 as float16, 5-bit
  codes; value = d * (q - 16). Bit-identical to ggml's reference quantizer. Q4_K's fallback.

numpy only; callers pass row slices so temporaries stay a few MB (1B-parameter model: measured in
README's ISQ table).
"""

from __future__ import annotations

import numpy as np

Q8_0_VALUES, Q8_0_BYTES = 32, 34
QK_K, Q4_K_BYTES = 256, 144
Q5_0_VALUES, Q5_0_BYTES = 32, 22
Q4_0_VALUES, Q4_0_BYTES = 32, 18


def _round_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero, exactly as C's roundf (np.rint rounds halves to even; x + 0.5 rounds
    0.49999997 up): trunc(2 * fraction) is +-1 exactly when the fraction reaches a half."""
    whole = np.trunc(x)
    fraction = np.subtract(x, whole)
    fraction *= 2
    np.trunc(fraction, out=fraction)
    whole += fraction
    return whole


def _reduce_last(x: np.ndarray, op: np.ufunc) -> np.ndarray:
    """`op` over the last axis (a power of two) by halving: numpy reduces a short last axis ~10x slower
    than it applies an elementwise op."""
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = op(x[..., :half], x[..., half:])
    return x[..., 0]


def _f16(values: np.ndarray) -> np.ndarray:
    """float32 [n] -> its float16 bytes, uint8 [n, 2]."""
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q8_0(matrix: np.ndarray) -> np.ndarray:
    """float [rows, cols] (cols a multiple of 32) -> uint8 [rows, cols / 32 * 34]."""
    rows, cols = matrix.shape
    blocks = np.asarray(matrix, dtype=np.float32).reshape(-1, Q8_0_VALUES)
    d = _reduce_last(np.abs(blocks), np.maximum) / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    codes = _round_away(np.multiply(blocks, inverse[:, None])).astype(np.int8).view(np.uint8)
    return np.concatenate((_f16(d), codes), axis=1).reshape(rows, cols // Q8_0_VALUES * Q8_0_BYTES)


def quantize_q4_k(matrix: np.ndarray) -> np.ndarray:
    """float [rows, cols] (cols a multiple of 256) -> uint8 [rows, cols / 256 * 144]."""
    rows, cols = matrix.shape
    x = np.asarray(matrix, dtype=np.float32).reshape(-1, 8, 32)  # [blocks, sub-blocks, values]
    low = np.minimum(_reduce_last(x, np.minimum), 0)  # the offset only shifts values up: codes start at 0
    dmin = (-low).max(axis=-1) / np.float32(63)
    dmin16 = dmin.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Rounded up: offset dmin * m >= -low, so no value falls below code 0.
        m = np.nan_to_num(np.ceil(-low / dmin16[:, None])).clip(0, 63)
        offset = dmin16[:, None] * m  # [blocks, 8]
        span = _reduce_last(x, np.maximum) + offset  # what 15 steps must cover
        d16 = (span.max(axis=-1) / np.float32(15 * 63)).astype(np.float16).astype(np.float32)
        sc = np.nan_to_num(np.ceil(span / (15 * d16[:, None]))).clip(0, 63)
        step = d16[:, None] * sc  # [blocks, 8]; 0 only where the sub-block is the constant -offset
        inverse = np.where(step > 0, np.float32(1) / step, np.float32(0)).astype(np.float32)
    shifted = np.add(x, offset[..., None])
    shifted *= inverse[..., None]
    np.rint(shifted, out=shifted)
    q = np.clip(shifted, 0, 15, out=shifted).astype(np.uint8)
    sc8, m8 = sc.astype(np.uint8), m.astype(np.uint8)
    scales = np.concatenate(  # 6-bit sc, m: low bits of the first four, high bits of the rest on top
        (
            sc8[:, :4] | ((sc8[:, 4:] >> 4) << 6),
            m8[:, :4] | ((m8[:, 4:] >> 4) << 6),
            (sc8[:, 4:] & 0x0F) | ((m8[:, 4:] & 0x0F) << 4),
        ),
        axis=1,
    )
    pairs = q.reshape(-1, 4, 2, 32)  # sub-blocks 2j and 2j + 1 share 32 bytes: low and high nibble
    nibbles = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    out = np.concatenate((_f16(d16), _f16(dmin16), scales, nibbles), axis=1)
    return out.reshape(rows, cols // QK_K * Q4_K_BYTES)


def _signed_codes(matrix: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0's rule on 32-value blocks: the value of largest magnitude (the first on ties) maps to
    code 0, d = it / -half (signed); codes = trunc(x / d + half + 0.5) in 0..2 * half - 1.
    Returns (d float32 [blocks], codes uint8 [blocks, 32])."""
    blocks = np.asarray(matrix, dtype=np.float32).reshape(-1, 32)
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = extreme / np.float32(-half)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    shifted = np.multiply(blocks, inverse[:, None])
    shifted += np.float32(half + 0.5)
    return d, np.trunc(shifted).astype(np.uint8).clip(0, 2 * half - 1)


def quantize_q4_0(matrix: np.ndarray) -> np.ndarray:
    """float [rows, cols] (cols a multiple of 32) -> uint8 [rows, cols / 32 * 18]."""
    rows, cols = matrix.shape
    d, q = _signed_codes(matrix, 8)
    nibbles = q[:, :16] | (q[:, 16:] << 4)  # value j low nibble, value j + 16 high
    return np.concatenate((_f16(d), nibbles), axis=1).reshape(rows, cols // Q4_0_VALUES * Q4_0_BYTES)


def quantize_q5_0(matrix: np.ndarray) -> np.ndarray:
    """float [rows, cols] (cols a multiple of 32) -> uint8 [rows, cols / 32 * 22]; Q4_K's stand-in for rows
    that do not split into 256s (llama.cpp's choice too)."""
    rows, cols = matrix.shape
    d, q = _signed_codes(matrix, 16)
    nibbles = (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)  # value j low nibble, value j + 16 high
    high = np.packbits(q >> 4, axis=1, bitorder="little")  # bit j of the 32-bit word: value j's fifth bit
    out = np.concatenate((_f16(d), high, nibbles), axis=1)
    return out.reshape(rows, cols // Q5_0_VALUES * Q5_0_BYTES)


QUANTIZERS = {
    "Q8_0": (quantize_q8_0, Q8_0_VALUES),
    "Q4_K": (quantize_q4_k, QK_K),
    "Q5_0": (quantize_q5_0, Q5_0_VALUES),
    "Q4_0": (quantize_q4_0, Q4_0_VALUES),
}
