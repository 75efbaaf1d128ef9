"""4-bit weights on CUDA, and 4-bit quantization of dense weights at load (`--isq q4`).

On CUDA, GGUF Q4_0/Q4_1 linears (and `--isq q4` ones) stay 4-bit, in torch's tinygemm layout
(`_convert_weight_to_int4pack` + `_weight_int4pack_mm`, bf16 activations, sm80+), our Triton W4A16
kernel's plain layout (`TritonInt4Weight`, triton_int4.py), or both (`LOCALCHAT_CUDA_INT4`). tinygemm is
the faster one-row kernel (decode) but compute-bound from ~32 rows; Triton runs many-row steps (prefill,
batches) 4-10x faster from 256 rows. By default both forms are kept where GPU memory allows, each
serving the steps it is fast at (`cuda_int4_kernel`). Both kernels compute `w = (q - 8) * scale + zero`
per group of 32 along the input dimension: exactly the CPU kernel's rule, so the scale/zero mapping of
quant.py's table carries over unchanged.
Decode reads ~4.5 bits per weight instead of 16, which is what bounds single-stream speed on a GPU.

`--isq q4` turns an unquantized matrix into the same parts: per group of 32 values, min/max
(asymmetric) 4-bit codes, `scale = (max - min) / 15`, `zero = min + 8 * scale`, both rounded to bf16
before the codes are chosen. Both CPU (bf16) and CUDA run the result through their int4 kernels.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from localchat.backends.torch.cuda.triton_int4_weight import TritonInt4Weight
from localchat.config import backend_choices, backend_variable

GROUP_SIZE = 32
CUDA_INT4_ENV = "LOCALCHAT_CUDA_INT4"
CUDA_INT4_KERNELS = tuple(c for c in backend_choices(CUDA_INT4_ENV) if c != "auto")  # both, triton, tinygemm
# "both": steps of this many rows or more take the Triton kernel, fewer take tinygemm. Measured on an
# H200 (benchmarks/gpu_int4_bench.py, an 8B layer's four matrices): 1 row 0.09 ms tinygemm / 0.41 Triton,
# 16 rows 0.27 / 0.38, 64 rows 1.00 / 0.44, 2048 rows 30.7 / 3.4.
TRITON_FROM_ROWS = 32
# "both" keeps two 4-bit forms (~9 bits a weight): only while they take at most this share of free
# GPU memory, so the KV cache keeps the rest; otherwise tinygemm alone.
BOTH_FORMS_MAX_FREE_FRACTION = 0.5


@dataclass(slots=True)
class Int4CudaWeight:
    """A linear's matrix `[out, in]` in torch's CUDA int4 layout."""

    packed: torch.Tensor  # int32, `_convert_weight_to_int4pack`'s tiled layout
    scale_zeros: torch.Tensor  # bf16 [in / 32, out, 2]
    out_features: int
    in_features: int
    # The same codes in the Triton kernel's form, for steps of TRITON_FROM_ROWS rows or more ("both")
    many_rows: TritonInt4Weight | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)


def pack_triton(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, device: torch.device
) -> TritonInt4Weight:
    """codes uint8 [out, in] (0..15), scale/zero float32 [out, in / 32] -> the kernel's form."""
    pairs = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8)  # even code low, odd code high
    return TritonInt4Weight(
        pairs.contiguous().to(device),
        scale.to(device=device, dtype=torch.bfloat16).contiguous(),
        zero.to(device=device, dtype=torch.bfloat16).contiguous(),
    )


def cuda_int4_available(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    has_ops = hasattr(torch.ops.aten, "_weight_int4pack_mm") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack"
    )
    return has_ops and torch.cuda.get_device_capability(device) >= (8, 0)


def cuda_int4_kernel(four_bit_bytes: int, free_bytes: int | None) -> str:
    """`LOCALCHAT_CUDA_INT4`, resolved: "both", "triton" (our W4A16 kernel, triton_int4.py) or "tinygemm"
    (torch's). auto takes both forms where Triton is installed (CUDA builds of PyTorch ship it) and
    twice the model's 4-bit linears (`four_bit_bytes`) fit in BOTH_FORMS_MAX_FREE_FRACTION of the free
    GPU memory; otherwise tinygemm, the faster one-row kernel (decode)."""
    choice = backend_variable(CUDA_INT4_ENV)
    if choice != "auto":
        return choice
    fits = free_bytes is None or 2 * four_bit_bytes <= free_bytes * BOTH_FORMS_MAX_FREE_FRACTION
    return "both" if fits and importlib.util.find_spec("triton") is not None else "tinygemm"


def inner_k_tiles(in_features: int) -> int | None:
    """The packing's K tiling: the largest of 8, 4, 2 whose tile (16 * tiles) divides `in_features`."""
    return next((t for t in (8, 4, 2) if in_features % (16 * t) == 0), None)


def pack_cuda(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, device: torch.device
) -> Int4CudaWeight:
    """codes uint8 [out, in] (0..15), scale/zero float32 [out, in / 32] -> the CUDA kernel's form."""
    out, cols = codes.shape
    tiles = inner_k_tiles(cols)
    assert tiles is not None, "callers check inner_k_tiles first"
    pairs = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)  # two codes a byte, even one high
    packed = torch.ops.aten._convert_weight_to_int4pack(pairs.to(device), tiles)
    scale_zeros = torch.stack((scale.t(), zero.t()), dim=-1).to(device=device, dtype=torch.bfloat16)
    return Int4CudaWeight(packed, scale_zeros.contiguous(), out, cols)


def cuda_int4_linear(x: torch.Tensor, weight: Int4CudaWeight | TritonInt4Weight) -> torch.Tensor:
    """x [T, in] bf16 -> [T, out]: Triton for its own form and, with both kept, for steps of
    TRITON_FROM_ROWS rows or more; tinygemm otherwise."""
    if isinstance(weight, Int4CudaWeight) and weight.many_rows is not None and x.shape[0] >= TRITON_FROM_ROWS:
        weight = weight.many_rows
    if isinstance(weight, TritonInt4Weight):
        from localchat.backends.torch.cuda.triton_int4 import triton_int4_linear  # imports Triton: CUDA only

        return triton_int4_linear(x, weight)
    if x.shape[0] == 0:  # a prefill chunk that samples nothing: the kernel refuses an empty launch
        return x.new_empty(0, weight.out_features)
    return torch.ops.aten._weight_int4pack_mm(x, weight.packed, GROUP_SIZE, weight.scale_zeros)


def quantize_q4(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A dense [out, in] matrix -> (codes uint8 [out, in], scale, zero float32 [out, in / 32])."""
    out, cols = matrix.shape
    groups = matrix.float().reshape(out, cols // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    # Both kernels take scale and zero in bf16: round them first and pick codes against the rounded
    # values, so what the kernel computes is exactly this quantization (no shared per-group offset).
    scale = ((high - low) / 15).to(torch.bfloat16).float()
    zero = (low + 8 * scale).to(torch.bfloat16).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: every code 8
    codes = ((groups - zero[..., None]) / safe[..., None] + 8).round().clamp(0, 15).to(torch.uint8)
    return codes.reshape(out, cols), scale, zero


def dequantize_q4(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The values the int4 kernels compute with: (q - 8) * scale + zero, float32 [out, in]."""
    out, cols = codes.shape
    groups = codes.float().reshape(out, cols // GROUP_SIZE, GROUP_SIZE) - 8
    return (groups * scale[..., None] + zero[..., None]).reshape(out, cols)
