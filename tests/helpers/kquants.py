"""Plain (not error-optimizing) encoders for GGUF's Q2_K, Q3_K, Q4_K, Q5_K and Q6_K blocks, for test files.

The gguf package can decode these super-block formats but not write them; these encoders write the
same byte layouts gguf.quants.dequantize reads, with simple min/max scale choices. 256 values per block.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)  # [blocks, 2]


def _affine_scales(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Per 32-value sub-block y = d*sc*q - dmin*m with 6-bit sc, m. x: [blocks, 8, 32]."""
    lo = np.minimum(x.min(axis=-1), 0.0)  # the offset can only pull values down
    scale = (x.max(axis=-1) - lo) / levels  # [blocks, 8]
    d = scale.max(axis=-1) / 63
    dmin = (-lo).max(axis=-1) / 63
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.round(scale / d16[:, None])).clip(0, 63).astype(np.uint8)
        m = np.nan_to_num(np.round(-lo / dmin16[:, None])).clip(0, 63).astype(np.uint8)
        step = (d16[:, None] * sc)[..., None]
        q = np.nan_to_num(np.round((x + (dmin16[:, None] * m)[..., None]) / step)).clip(0, levels)
    return d, dmin, sc, m, q.astype(np.uint8)


def _symmetric_scales(x: np.ndarray, q_max: int, sc_max: int, q_lo: int, q_hi: int) -> tuple[np.ndarray, ...]:
    """Per 16 values y = d * sc * q, no offset: sc in 0..sc_max per group, q in q_lo..q_hi (|q| reaching
    q_max at the group's largest value). x: [blocks, 16, 16] -> (d [blocks], sc [blocks, 16], q int32)."""
    scale = np.abs(x).max(axis=-1) / q_max  # [blocks, 16]
    d = scale.max(axis=-1) / sc_max
    d16 = d.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.round(scale / d16[:, None])).clip(0, sc_max).astype(np.int32)
        step = (d16[:, None] * sc)[..., None]
        q = np.nan_to_num(np.round(x / step)).clip(q_lo, q_hi).astype(np.int32)
    return d, sc, q


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins into 12 bytes: low 6 bits of the first four in bytes 0-7, the rest split."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return out


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Sub-blocks 2g and 2g+1 share 32 bytes: low and high nibble. q: [blocks, 8, 32] -> [blocks, 128]."""
    pairs = q.reshape(q.shape[0], 4, 2, 32) & 0x0F
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(q.shape[0], 128)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    blocks = x.reshape(-1, 8, 32).astype(np.float32)
    d, dmin, sc, m, q = _affine_scales(blocks, 15)
    packed = [_fp16_bytes(d), _fp16_bytes(dmin), _pack_scales(sc, m), _nibbles(q)]
    return np.concatenate(packed, axis=1).reshape(*x.shape[:-1], -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    blocks = x.reshape(-1, 8, 32).astype(np.float32)
    d, dmin, sc, m, q = _affine_scales(blocks, 31)
    high = ((q >> 4) & 1).astype(np.uint8)  # [blocks, 8, 32]: bit k of byte l is sub-block k's value l
    qh = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    packed = [_fp16_bytes(d), _fp16_bytes(dmin), _pack_scales(sc, m), qh, _nibbles(q)]
    return np.concatenate(packed, axis=1).reshape(*x.shape[:-1], -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    blocks = x.reshape(-1, 16, 16).astype(np.float32)
    n = blocks.shape[0]
    d, scales, signed = _symmetric_scales(blocks, 31, 127, -32, 31)
    sc = scales.astype(np.int8)
    q = (signed + 32).astype(np.uint8)
    q = q.reshape(n, 8, 32)  # chunk c of 32 values: half c%2, nibble (c//2)%2, group c//4
    ql = np.zeros((n, 2, 64), dtype=np.uint8)
    qh = np.zeros((n, 2, 32), dtype=np.uint8)
    for c in range(8):
        group, nibble, half = c // 4, (c // 2) % 2, c % 2
        ql[:, group, half * 32 : half * 32 + 32] |= (q[:, c] & 0x0F) << (4 * nibble)
        qh[:, group] |= ((q[:, c] >> 4) & 0x03) << (2 * (c % 4))
    packed = [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _fp16_bytes(d)]
    return np.concatenate(packed, axis=1).reshape(*x.shape[:-1], -1)


def _two_bit_planes(q: np.ndarray) -> np.ndarray:
    """2-bit codes of 256 values into 64 bytes: value 128n + 32j + l sits in byte 32n + l at bits 2j.
    q: [blocks, 256] -> [blocks, 64]."""
    planes = (q.reshape(q.shape[0], 2, 4, 32) & 3) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    return np.bitwise_or.reduce(planes, axis=2).reshape(q.shape[0], 64)


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """Per 16 values y = d * sc * q - dmin * m (q 0..3; sc, m 4-bit, one byte each). Layout: scales[16],
    qs[64], d, dmin."""
    blocks = x.reshape(-1, 16, 16).astype(np.float32)
    lo = np.minimum(blocks.min(axis=-1), 0.0)
    scale = (blocks.max(axis=-1) - lo) / 3  # [blocks, 16]
    d, dmin = scale.max(axis=-1) / 15, (-lo).max(axis=-1) / 15
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.round(scale / d16[:, None])).clip(0, 15).astype(np.uint8)
        m = np.nan_to_num(np.round(-lo / dmin16[:, None])).clip(0, 15).astype(np.uint8)
        step = (d16[:, None] * sc)[..., None]
        q = np.nan_to_num(np.round((blocks + (dmin16[:, None] * m)[..., None]) / step)).clip(0, 3)
    n = blocks.shape[0]
    packed = [
        sc | (m << 4),
        _two_bit_planes(q.astype(np.uint8).reshape(n, 256)),
        _fp16_bytes(d),
        _fp16_bytes(dmin),
    ]
    return np.concatenate(packed, axis=1).reshape(*x.shape[:-1], -1)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """Per 16 values y = d * s * q (q -4..3, s 6-bit stored as s + 32). Layout: hmask[32] (bit i of byte l:
    value 32i + l's third bit, set meaning q + 4 >= 4), qs[64] (low two bits), scales[12], d."""
    blocks = x.reshape(-1, 16, 16).astype(np.float32)
    n = blocks.shape[0]
    d, sc, q = _symmetric_scales(blocks, 4, 31, -4, 3)
    codes = (q + 4).reshape(n, 256).astype(np.uint8)  # 0..7
    high = (codes >> 2).reshape(n, 8, 32)  # [blocks, bit i, byte l]
    hmask = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    stored = (sc + 32).astype(np.uint8)  # [blocks, 16], 6 bits
    scales = np.zeros((n, 12), dtype=np.uint8)
    for j in range(
        16
    ):  # low 4 bits: byte j % 8 at bit 4 * (j // 8); high 2: byte 8 + j % 4 at bit 2 * (j // 4)
        scales[:, j % 8] |= (stored[:, j] & 15) << (4 * (j // 8))
        scales[:, 8 + j % 4] |= (stored[:, j] >> 4) << (2 * (j // 4))
    packed = [hmask, _two_bit_planes(codes), scales, _fp16_bytes(d)]
    return np.concatenate(packed, axis=1).reshape(*x.shape[:-1], -1)


def term_sizes(qtype: str, raw: np.ndarray) -> np.ndarray | None:
    """Q2_K/Q3_K: per value, the largest term a kernel adds for its 16-value group (scale * largest code,
    or the offset), float64 [rows, values]; None for types whose terms stay within 3x the group's |w|.
    Q3_K's offset is 4 * scale whatever the codes, so a group of small codes has terms ~7x its |w|."""
    rows = raw.shape[0]
    if qtype == "Q2_K":
        blocks = raw.reshape(rows, -1, 84)
        sc = blocks[..., :16].astype(np.float64)
        d = blocks[..., 80:82].copy().view(np.float16).astype(np.float64)
        dmin = blocks[..., 82:84].copy().view(np.float16).astype(np.float64)
        size = np.maximum(np.abs(d) * (sc % 16) * 3, np.abs(dmin) * (sc // 16))
    elif qtype == "Q3_K":
        blocks = raw.reshape(rows, -1, 110)
        sb = blocks[..., 96:108].astype(np.int64)
        d = blocks[..., 108:110].copy().view(np.float16).astype(np.float64)
        j = np.arange(16)
        stored = ((sb[..., j % 8] >> (4 * (j // 8))) & 15) | (
            ((sb[..., 8 + j % 4] >> (2 * (j // 4))) & 3) << 4
        )
        size = np.abs(d) * np.abs(stored - 32) * 7
    else:
        return None
    return np.repeat(size.reshape(rows, -1), 16, axis=1)


K_QUANTIZERS = {
    "Q2_K": quantize_q2_k,
    "Q3_K": quantize_q3_k,
    "Q4_K": quantize_q4_k,
    "Q5_K": quantize_q5_k,
    "Q6_K": quantize_q6_k,
}
