"""GGUF NVFP4 (GGML type 40), Q1_0 (41) and Q2_0 (42): their geometry, their reference dequantizers, and
their registration with the gguf package where the installed release lacks them.

Definitions (ggml's ggml-common.h / ggml-quants.c; csrc/lc_lowbit.h runs them):
- NVFP4: 64 values in 36 bytes: 4 unsigned-E4M3 scale bytes (one per 16 values), then 32 bytes of E2M1
  codes, 8 per 16 values (value j of a 16 in the low nibble of byte j, j + 8 in the high one). ggml keeps
  the E2M1 values doubled (MXFP4's table) and halves the scale: value = table[code] * ue4m3(s) / 2.
- Q1_0: 128 values in 18 bytes: an f16 scale d, then one bit per value (bit j % 8 of byte j / 8): +d
  where set, -d where clear (Bonsai-style 1-bit models).
- Q2_0: 64 values in 18 bytes: an f16 scale d, then 2-bit codes q (value j in bits 2 (j % 4) of byte
  j / 4): value (q - 1) d.

gguf 0.19 knows NVFP4 and Q1_0 by name but dequantizes only NVFP4, and has no Q2_0 at all, so its
reader refuses a Q2_0 file. `register_gguf_types` adds what is missing to the package's type enum and
size table (once, at import of the GGUF modules); a later gguf release that has them is left alone.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# name -> (GGML type id, values per block, bytes per block)
LOWBIT_TYPES: dict[str, tuple[int, int, int]] = {
    "NVFP4": (40, 64, 36),
    "Q1_0": (41, 128, 18),
    "Q2_0": (42, 64, 18),
}
# E2M1 doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times 2): ggml's kvalues_mxfp4
E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def _ue4m3_half_table() -> np.ndarray:
    """ue4m3(x) / 2 for every byte: (8 + m) 2^(e - 11) for exponent field e > 0, m 2^-10 for e = 0; bit 7
    ignored, 0 and 0x7F zero (ggml_ue4m3_to_fp32). Every entry is exact in float32."""
    x = np.arange(256)
    e, m = (x >> 3) & 15, (x & 7).astype(np.float64)
    value = np.where(e == 0, np.ldexp(m, -10), np.ldexp(8.0 + m, e - 11))
    value[(x == 0) | (x == 0x7F)] = 0.0
    return value.astype(np.float32)


UE4M3_HALF = _ue4m3_half_table()


def register_gguf_types() -> None:
    """Make GGMLQuantizationType / GGML_QUANT_SIZES know every LOWBIT_TYPES entry (idempotent).

    An IntEnum cannot be extended by its API: the member is made as Enum itself makes one and entered in
    the enum's three lookup tables, so `GGMLQuantizationType(42)`, `["Q2_0"]` and the reader all work."""
    enum_cls = GGMLQuantizationType
    for name, (type_id, values, size) in LOWBIT_TYPES.items():
        member = enum_cls._value2member_map_.get(type_id)
        if member is None:
            member = int.__new__(enum_cls, type_id)
            member._name_ = name
            member._value_ = type_id
            enum_cls._value2member_map_[type_id] = member
            enum_cls._member_map_[name] = member
            enum_cls._member_names_.append(name)
        if member not in GGML_QUANT_SIZES:
            GGML_QUANT_SIZES[member] = (values, size)  # type: ignore[index]


def dequantize_lowbit(blocks: np.ndarray, qtype: str) -> np.ndarray:
    """Raw blocks (uint8, any shape holding whole blocks) -> float32 values, flat, in order: each value the
    reference's own float32 product, so csrc/lc_lowbit.h's decode equals it bit for bit."""
    _, values, size = LOWBIT_TYPES[qtype]
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, size)
    n = b.shape[0]
    if qtype == "NVFP4":
        d = UE4M3_HALF[b[:, :4]].reshape(n, 4, 1)
        qs = b[:, 4:].reshape(n, 4, 8)
        codes = np.concatenate([qs & 15, qs >> 4], axis=-1)  # [n, 4, 16]: low nibbles, then high ones
        return (d * E2M1_DOUBLED[codes]).reshape(-1)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    if qtype == "Q1_0":
        bits = np.unpackbits(b[:, 2:], axis=1, bitorder="little").astype(bool)  # [n, 128]
        return np.where(bits, d, -d).reshape(-1)
    q = (b[:, 2:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3  # [n, 16, 4]
    return ((q.reshape(n, values).astype(np.float32) - 1.0) * d).reshape(-1)


register_gguf_types()
