"""MXFP4 (OCP microscaling FP4) as gpt-oss checkpoints ship their experts: `*_blocks` uint8
[..., groups, 16] holding two 4-bit e2m1 codes per byte (low nibble first) and `*_scales` uint8
[..., groups], one e8m0 power of two (biased by 127) per 32 values.

At load they are repacked into GGML's MXFP4 blocks (`to_ggml_blocks`), the form llama.cpp's converter
writes into a GGUF: per 32 values the same exponent byte, then 16 bytes whose byte j holds value j (low
nibble) and value j + 16 (high); the codes are unchanged, only their order within a block moves. Backends
then treat them like a GGUF's MXFP4 tensors: localchat's CPU kernels run them in place (4.25 bits a
weight), anything else dequantizes them (`WeightTensor.dequantize`, which gives `dequantize_mxfp4`'s values).
"""

from __future__ import annotations

import numpy as np

# e2m1 code -> value: sign bit 3, then exponent and mantissa (0, 0.5 subnormal, 1 ... 6).
_E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32
)
BLOCK = 32  # values per scale


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> float32 [..., G * 32]."""
    blocks = np.asarray(blocks, dtype=np.uint8)
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {blocks.shape} do not match scales {scales.shape}")
    values = np.empty((*blocks.shape, 2), dtype=np.float32)
    values[..., 0] = _E2M1[blocks & 0x0F]
    values[..., 1] = _E2M1[blocks >> 4]
    exponents = np.asarray(scales, dtype=np.int32)[..., None, None] - 127
    values = np.ldexp(values, exponents)
    return values.reshape(*blocks.shape[:-2], -1)


def to_ggml_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> GGML MXFP4 blocks uint8 [..., G * 17]."""
    blocks = np.asarray(blocks, dtype=np.uint8)
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {blocks.shape} do not match scales {scales.shape}")
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], BLOCK)  # in order
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate([np.asarray(scales, dtype=np.uint8)[..., None], packed], axis=-1)
    return out.reshape(*blocks.shape[:-2], -1)
