"""Turning a loader's `WeightTensor` into a torch tensor: the one place that knows about quantization.

Today GGUF quantized blocks are dequantized to the compute dtype at load. Keeping them quantized
(e.g. int8/int4 weight-only matmuls) plugs in here: return a packed tensor plus a matmul for it.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from localchat.weights.tensors import WeightTensor


def to_tensor(weight: WeightTensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh tensor (never aliasing the memory-mapped file) of `weight.shape` in `dtype` on `device`."""
    if weight.is_quantized:
        array = weight.dequantize()
    elif weight.dtype == "BF16":
        array = np.ascontiguousarray(weight.data).view(np.int16)
    else:
        array = np.ascontiguousarray(weight.data)
    with warnings.catch_warnings():
        # Memory-mapped arrays are read-only; we copy right below, so torch's warning does not apply.
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    if weight.dtype == "BF16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.reshape(weight.shape).to(device=device, dtype=dtype, copy=True)
