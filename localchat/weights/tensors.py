"""A weight as the loaders hand it to backends: raw (often memory-mapped) bytes plus what they mean.

Dense tensors arrive as numpy arrays (bf16 as a uint16 view); GGUF quantized tensors arrive as their
raw blocks so a backend may keep them quantized (MLX does) or call `dequantize()` (torch does today).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localchat.weights.lowbit import LOWBIT_TYPES, dequantize_lowbit

DENSE_DTYPES = ("F32", "F16", "BF16")


@dataclass(slots=True)
class WeightTensor:
    name: str  # Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
    shape: tuple[int, ...]  # logical shape in PyTorch order: [out_features, in_features] for linears
    dtype: str  # "F32" | "F16" | "BF16" | a GGUF quant type name such as "Q4_1"
    data: np.ndarray  # dense: values in `shape` (bf16 as uint16); quantized: uint8 [rows, bytes_per_row]

    @property
    def is_quantized(self) -> bool:
        return self.dtype not in DENSE_DTYPES

    def dequantize(self) -> np.ndarray:
        """float32 values in `shape` (bf16 widened exactly, quantized blocks expanded)."""
        if self.dtype == "F32":
            return np.asarray(self.data, dtype=np.float32).reshape(self.shape)
        if self.dtype == "F16":
            return np.asarray(self.data).astype(np.float32).reshape(self.shape)
        if self.dtype == "BF16":
            widened = np.asarray(self.data, dtype=np.uint16).astype(np.uint32) << 16
            return widened.view(np.float32).reshape(self.shape)
        if self.dtype in LOWBIT_TYPES:  # types gguf.quants cannot expand (or lacks)
            return dequantize_lowbit(np.asarray(self.data), self.dtype).reshape(self.shape)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        qtype = GGMLQuantizationType[self.dtype]
        return np.asarray(dequantize(np.asarray(self.data), qtype), dtype=np.float32).reshape(self.shape)
