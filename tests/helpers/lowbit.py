"""Encoders and random blocks for GGUF NVFP4, Q1_0 and Q2_0 (localchat/weights/lowbit.py has the format),
written from ggml's reference quantizers (quantize_row_{nvfp4,q1_0,q2_0}_ref): gguf 0.19 quantizes none
of them. Used by the tiny GGUF writer (tests/helpers/tiny_gguf.py) and the kernel tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localchat.weights.lowbit import E2M1_DOUBLED, LOWBIT_TYPES, UE4M3_HALF


def _f16(values: np.ndarray) -> np.ndarray:
    """float32 [..., 1] -> the f16 scale's two bytes [..., 2]."""
    return values.astype(np.float16).view(np.uint8)


def _round_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (numpy rounds them to even)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def ue4m3_from_float(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_ue4m3: the E4M3 byte of non-negative float32 x (clamped to 448), rounding on the
    fourth mantissa bit; 0x7E above the range."""
    x = np.minimum(np.maximum(x.astype(np.float32), 0), np.float32(448.0))
    bits = x.view(np.uint32).astype(np.int64)
    exp = ((bits >> 23) & 0xFF) - 127 + 7
    man = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    exp, man = np.where(man > 7, exp + 1, exp), np.where(man > 7, 0, man)
    sub = np.clip((x * np.float32(512.0) + np.float32(0.5)).astype(np.int64), 0, 7)
    out = np.where(exp >= 15, 0x7E, (exp << 3) | man)
    out = np.where(exp <= 0, sub, out)
    return np.where(x > 0, out, 0).astype(np.uint8)


def quantize_nvfp4(data: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> NVFP4 blocks [rows, cols / 64 * 36]: per 16 values the scale amax / 6 as
    UE4M3, each value the nearest of the E2M1 table times it (the first on ties, as ggml)."""
    rows = data.shape[0]
    groups = data.astype(np.float32).reshape(rows, -1, 4, 16)
    scales = ue4m3_from_float(np.abs(groups).max(axis=-1) / np.float32(6.0))  # [rows, blocks, 4]
    d = UE4M3_HALF[scales][..., None]
    idx = np.abs(E2M1_DOUBLED * d[..., None] - groups[..., None]).argmin(axis=-1).astype(np.uint8)
    codes = idx[..., :8] | (idx[..., 8:] << 4)  # [rows, blocks, 4, 8]
    blocks = np.concatenate([scales, codes.reshape(rows, -1, 32)], axis=-1)
    return blocks.reshape(rows, -1)


def quantize_q1_0(data: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> Q1_0 blocks [rows, cols / 128 * 18]: d = mean |x|, a set bit where x >= 0."""
    rows = data.shape[0]
    groups = data.astype(np.float32).reshape(rows, -1, 128)
    # summed in order as ggml does (cumsum is sequential; sum is pairwise and may round the f16 d apart)
    d = np.abs(groups).cumsum(axis=-1, dtype=np.float32)[..., -1:] / np.float32(128)
    bits = np.packbits(groups >= 0, axis=-1, bitorder="little")
    return np.concatenate([_f16(d), bits], axis=-1).reshape(rows, -1)


def quantize_q2_0(data: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> Q2_0 blocks [rows, cols / 64 * 18]: d = amax, q = round(x / d) + 1 in 0..3."""
    rows = data.shape[0]
    groups = data.astype(np.float32).reshape(rows, -1, 64)
    d = np.abs(groups).max(axis=-1, keepdims=True)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.clip(_round_away(groups * inv) + 1, 0, 3).astype(np.uint8).reshape(rows, -1, 16, 4)
    packed = q[..., 0] | (q[..., 1] << 2) | (q[..., 2] << 4) | (q[..., 3] << 6)
    return np.concatenate([_f16(d), packed], axis=-1).reshape(rows, -1)


def any_rank(encode: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """The encoder over the last axis of any-rank data (a stacked [experts, rows, cols] tensor), leading
    axes kept: the GGUF writer reads the tensor's shape from the blocks' shape."""

    def encode_rows(data: np.ndarray) -> np.ndarray:
        return encode(data.reshape(-1, data.shape[-1])).reshape(*data.shape[:-1], -1)

    return encode_rows


LOWBIT_QUANTIZERS = {
    name: any_rank(encode)
    for name, encode in (("NVFP4", quantize_nvfp4), ("Q1_0", quantize_q1_0), ("Q2_0", quantize_q2_0))
}


def random_lowbit_blocks(qtype: str, rows: int, cols: int, seed: int, any_scale: bool = False) -> np.ndarray:
    """[rows, bytes] random blocks of `qtype`: random codes; scales moderate (NVFP4: exponent fields 6-7;
    Q1_0 / Q2_0: f16 in [2^-7, 2^-5), either sign) or, with `any_scale`, any finite value (every
    UE4M3 byte; f16 zeros and subnormals too)."""
    _, values, size = LOWBIT_TYPES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, cols // values, size), dtype=np.uint8)
    if qtype == "NVFP4":
        if not any_scale:
            blocks[..., :4] = rng.integers(0x30, 0x40, size=(rows, cols // values, 4), dtype=np.uint8)
    else:
        top = blocks[..., 1] & 0x80  # the sign
        exp = rng.integers(0, 31, size=top.shape) if any_scale else rng.integers(8, 10, size=top.shape)
        blocks[..., 1] = top | (exp.astype(np.uint8) << 2) | (blocks[..., 1] & 3)
    return blocks.reshape(rows, -1)
