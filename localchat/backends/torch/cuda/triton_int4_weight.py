"""The Triton W4A16 kernel's weight layout (quant_cuda.py's module docstring), apart from the kernel
(triton_int4.py imports Triton) and from the code that builds and dispatches it (quant_cuda.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class TritonInt4Weight:
    """A linear's matrix `[out, in]` as 4-bit codes with bf16 group scales/zeros (module docstring)."""

    codes: torch.Tensor  # uint8 [out, in / 2]
    scale: torch.Tensor  # bf16 [out, in / 32]
    zero: torch.Tensor  # bf16 [out, in / 32]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1] * 2)
