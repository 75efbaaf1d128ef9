"""`--isq q8_0 | q4_k | q4_0`: dense (safetensors) matrices quantized at load into GGUF blocks for our CPU
kernels.

Each matrix becomes a `BlockMatrix`, the form a GGUF file's weights take, so decode and prefill run on
the same kernels with no dense copy. Which type each matrix takes (linears the chosen one, Q4_K's
fallback to Q5_0 for rows that do not split into 256s, e.g. SmolLM2's 576; embedding and LM head Q8_0)
is weights/isq_plan.py's rule, shared with the pre-load RAM check. Rows are quantized a slice at a time
from the memory-mapped file, so load never holds the whole matrix in float32 beside its blocks.
"""

from __future__ import annotations

import numpy as np
import torch

from localchat.backends.torch.cpu.kernels import BLOCKS, BlockMatrix, Kernels, Segment
from localchat.weights import isq_plan
from localchat.weights.block_quantize import QUANTIZERS
from localchat.weights.isq_plan import BLOCK_TYPES
from localchat.weights.tensors import WeightTensor

__all__ = ["BLOCK_TYPES", "block_type", "quantize_weight"]
SLICE_VALUES = 1 << 18  # values quantized per numpy call: 1 MB of float32 and a few temporaries


def block_type(qtype: str, weight: WeightTensor, head: bool) -> str | None:
    """The GGUF type `weight` becomes under `--isq` (`qtype`: a value of BLOCK_TYPES), None: stays dense."""
    if weight.is_quantized:
        return None
    return isq_plan.block_type(qtype, weight.shape, head)


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
