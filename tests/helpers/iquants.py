"""Test data for the GGUF i-quants (the `gguf` package dequantizes them but quantizes only TQ1_0/TQ2_0).

`quantize_iq4_nl` / `quantize_iq4_xs` are plain nearest-value encoders of the two 4-bit non-linear types
(ggml's layouts: a float16 scale per 32 values, or per 256 with 6-bit sub-scales per 32, and 4-bit indices
into the 16 values `gguf.quants.IQ4_NL.kvalues`), good enough for tiny test models. `random_blocks` makes
valid blocks of any i-quant or ternary type: random bytes with every float16 scale set to a sane value.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import IQ4_NL

from tests.helpers.lowbit import any_rank

KVALUES = np.array(IQ4_NL.kvalues, dtype=np.float32)


def _nearest(scaled: np.ndarray) -> np.ndarray:
    """Index of the nearest of the 16 values for each entry of `scaled` (in value units)."""
    return np.abs(scaled[..., None] - KVALUES).argmin(axis=-1).astype(np.uint8)


def _pack_nibbles(idx: np.ndarray) -> np.ndarray:
    """[..., 32] indices -> [..., 16] bytes: value j in the low nibble of byte j, value j + 16 in its high."""
    return idx[..., :16] | (idx[..., 16:] << 4)


def _group_scale(groups: np.ndarray) -> np.ndarray:
    """Per 32 values: the signed value of largest magnitude over -127 (that value lands exactly on -127)."""
    pick = np.take_along_axis(groups, np.abs(groups).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    return pick / KVALUES[0]


def quantize_iq4_nl(data: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> IQ4_NL blocks [rows, cols / 32 * 18] (uint8)."""
    rows = data.shape[0]
    groups = data.astype(np.float32).reshape(rows, -1, 32)
    d = _group_scale(groups).astype(np.float16)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d.astype(np.float32)))
    idx = _nearest(groups * inv[..., None])
    blocks = np.concatenate([d[..., None].view(np.uint8), _pack_nibbles(idx)], axis=-1)
    return blocks.reshape(rows, -1)


def quantize_iq4_xs(data: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> IQ4_XS blocks [rows, cols / 256 * 136]: d, 6-bit sub-scales (stored + 32, low
    nibbles in 4 bytes, high 2 bits in a 16-bit word), 128 bytes of indices."""
    rows = data.shape[0]
    sub = data.astype(np.float32).reshape(rows, -1, 8, 32)
    ideal = _group_scale(sub)  # [rows, supers, 8]
    d = (np.abs(ideal).max(axis=-1) / 31).astype(np.float16)
    df = d.astype(np.float32)[..., None]
    ls = np.clip(np.round(np.where(df == 0, 0, ideal / np.where(df == 0, 1, df))), -32, 31).astype(np.int32)
    dl = df * ls
    inv = np.where(dl == 0, 0, 1 / np.where(dl == 0, 1, dl))
    idx = _nearest(sub * inv[..., None])
    stored = (ls + 32).astype(np.uint16)
    scales_h = np.zeros(stored.shape[:-1], dtype=np.uint16)
    for i in range(8):
        scales_h |= (stored[..., i] >> 4) << (2 * i)
    low = (stored & 15).astype(np.uint8)
    scales_l = low[..., 0::2] | (low[..., 1::2] << 4)
    blocks = np.concatenate(
        [
            d[..., None].view(np.uint8),
            scales_h[..., None].view(np.uint8),
            scales_l,
            _pack_nibbles(idx).reshape(rows, -1, 128),
        ],
        axis=-1,
    )
    return blocks.reshape(rows, -1)


IQ_QUANTIZERS = {"IQ4_NL": any_rank(quantize_iq4_nl), "IQ4_XS": any_rank(quantize_iq4_xs)}

# where each type keeps its float16 scale (byte offset in the block); IQ1_M spreads it over the top
# nibbles of its four 16-bit scale words (bytes 48-55)
_SCALE_AT = {"TQ1_0": 52, "TQ2_0": 64}


def random_blocks(qtype: str, rows: int, cols: int, seed: int, scale: float = 0.01) -> np.ndarray:
    """[rows, bytes] valid random blocks of `qtype`: random codes, signs and sub-scales, float16 scales
    random in [scale / 2, scale] (some negative) so no block holds inf or NaN."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(seed)
    n = rows * cols // block
    blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    d = (rng.uniform(scale / 2, scale, n) * rng.choice([-1, 1], n)).astype(np.float16)
    if qtype == "IQ1_M":
        bits = d.view(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16)  # [n, 4]
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 15) << 12)
        blocks[:, 48:56] = words.view(np.uint8)
    else:
        at = _SCALE_AT.get(qtype, 0)
        blocks[:, at : at + 2] = d[:, None].view(np.uint8)
    return blocks.reshape(rows, -1)
