"""The one place that knows about quantization: weight conversion at load, and the matmul every
projection calls.

Today GGUF quantized blocks are dequantized to the compute dtype at load and `linear` is `F.linear`.
Keeping them quantized (int4/int8 weight-only matmuls) plugs in here: `to_tensor` returns a packed
weight and `linear` dispatches on its type; models and layers stay unchanged.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F

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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ weight [out, in].T (+ bias) -> [T, out]."""
    return F.linear(x, weight, bias)
