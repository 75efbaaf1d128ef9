"""`--isq q8_0 | q4_k`: dense (safetensors) matrices quantized at load into GGUF blocks for our CPU kernels.

Each matrix becomes a `BlockMatrix`, the form a GGUF file's weights take, so decode and prefill run on
the same kernels with no dense copy. Linears take the chosen type; a row length Q4_K cannot split
(not a multiple of 256, e.g. SmolLM2's 576) falls back to Q5_0 (5.5 bits per weight), as llama.cpp does. The token embedding
and LM head take Q8_0: the output layer is the most sensitive to quantization (llama.cpp keeps it at 6-8
bits too). Rows are quantized a slice at a time from the memory-mapped file, so load never holds the
whole matrix in float32 beside its blocks.
"""

from __future__ import annotations

import numpy as np
import torch

from localchat.backends.torch.kernels import BLOCKS, BlockMatrix, Kernels, Segment
from localchat.weights.block_quantize import QUANTIZERS
from localchat.weights.tensors import WeightTensor

BLOCK_TYPES = {"q8_0": "Q8_0", "q4_k": "Q4_K"}  # --isq value -> GGUF type
HEAD_TYPE = "Q8_0"
FALLBACK = {"Q4_K": "Q5_0"}  # for rows that do not split into Q4_K's 256s (llama.cpp's choice too)
SLICE_VALUES = 1 << 18  # values quantized per numpy call: 1 MB of float32 and a few temporaries


def block_type(qtype: str, weight: WeightTensor, head: bool) -> str | None:
    """The GGUF type `weight` becomes under `--isq` (`qtype`: a value of BLOCK_TYPES), None: stays dense."""
    if weight.is_quantized or len(weight.shape) != 2:
        return None
    want = HEAD_TYPE if head else qtype
    for candidate in (want, FALLBACK.get(want, want), HEAD_TYPE):
        if weight.shape[1] % QUANTIZERS[candidate][1] == 0:
            return candidate
    return None


def quantize_weight(weight: WeightTensor, qtype: str, ops: Kernels) -> BlockMatrix:
    """A dense [out, in] weight as `qtype` blocks (row slices: no float32 copy of the whole matrix)."""
    rows, cols = weight.shape
    quantize, values = QUANTIZERS[qtype]
    bytes_per_row = cols // values * BLOCKS[qtype][2]
    blocks = np.empty((rows, bytes_per_row), dtype=np.uint8)
    step = max(1, SLICE_VALUES // cols)
    for start in range(0, rows, step):
        part = weight.data[start : start + step]
        dense = WeightTensor(weight.name, (part.shape[0], cols), weight.dtype, part).dequantize()
        blocks[start : start + part.shape[0]] = quantize(dense)
    return BlockMatrix([Segment(qtype, torch.from_numpy(blocks))], cols, ops)
