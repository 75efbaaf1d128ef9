"""The one place that knows about quantization: weight conversion at load, and the matmul every
projection calls.

GGUF Q4_0 / Q4_1 linears keep their 4-bit codes on CPU with bfloat16 compute: each 32-value block
becomes one group of torch's int4 weight-only kernel (`_weight_int4pack_mm_for_cpu`), which computes
`w = (q - 8) * scale + zero` per group (checked against a dequantized reference in
tests/backends/test_torch_quant.py):

| GGUF block | GGUF value | kernel q | scale | zero |
|---|---|---|---|---|
| Q4_0: d f16, 16 bytes of nibbles | d * (q - 8) | q | d | 0 |
| Q4_1: d f16, m f16, 16 bytes of nibbles | d * q + m | q | d | m + 8 d |

The kernel wants scale/zero in the activation dtype, so d (f16, 11 significant bits) and m + 8d round
to bfloat16 (8 bits): each moves by at most 2^-8 of itself, shared by the group's 32 weights (the dense
bf16 path rounds each weight by the same bound, independently). The kernel then sums in float32 and
rounds its output once (tests/backends/test_torch_quant.py). float32/float16 activations would keep the
scales exact, but the kernel has no fast path for them (30-50x slower on the dev box).

One-row steps read ~5 bits per weight instead of 16: the 30 layers of SmolLM2-135M take 6.5 instead of
14 ms per token on one thread (3.7 vs 8 on two). The kernel is compute-bound, though: at 16 rows (one
thread) to 32 (two) it only ties a dense oneDNN GEMM, and a 507-token prefill runs 1.9x slower. So
when memory allows (`QuantPolicy.dense_copy`) each int4 matrix also keeps its dequantized bf16 copy for
steps of `DENSE_FROM_ROWS` rows or more.

Every other quantized type, Q8_0 included, is dequantized to the compute dtype: torch has no int8
kernel with per-32 group scales, and its per-channel `_weight_int8pack_mm` was no faster than the bf16
GEMV (see the runner docstring). `LOCALCHAT_TORCH_QUANT` picks the mode: `auto` (int4 where it applies,
with dense copies if they fit in RAM), `int4` (never a dense copy: least memory) or `dequant` (all
dense, the reference path).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from localchat.errors import BackendUnavailableError
from localchat.weights.tensors import WeightTensor

QUANT_ENV = "LOCALCHAT_TORCH_QUANT"
QUANT_MODES = ("auto", "int4", "dequant")
INT4_TYPES = ("Q4_0", "Q4_1")
GROUP_SIZE = 32
# Rows from which the dense copy is used: the int4 kernel ties a dense GEMM at 16-32 rows (1-2 threads).
DENSE_FROM_ROWS = 24
DENSE_COPY_RAM_FRACTION = 0.4  # of MemAvailable: dense copies only when all of them fit well within it
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


@dataclass(slots=True, frozen=True)
class QuantPolicy:
    int4: bool = False  # Q4_0 / Q4_1 linears through the int4 kernel
    dense_copy: bool = False  # ...also keeping a bf16 copy for many-row steps


def int4_kernel_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


def pick_policy(
    device: torch.device, dtype: torch.dtype, dense_bytes: int, available: int | None
) -> QuantPolicy:
    """The env's mode, narrowed to what this device/dtype runs fast; `dense_bytes` estimates the dense
    copies (the model's linears in `dtype`), `available` the free RAM (None: unknown)."""
    mode = os.environ.get(QUANT_ENV, "auto").strip().lower() or "auto"
    if mode not in QUANT_MODES:
        raise BackendUnavailableError(
            f"{QUANT_ENV}={mode!r} is not a quantization mode; use one of {', '.join(QUANT_MODES)}."
        )
    usable = device.type == "cpu" and dtype == torch.bfloat16 and int4_kernel_available()
    if mode == "dequant" or not usable:
        return QuantPolicy()
    if mode == "int4":
        return QuantPolicy(int4=True)
    fits = available is None or dense_bytes <= available * DENSE_COPY_RAM_FRACTION
    return QuantPolicy(int4=True, dense_copy=fits)


@dataclass(slots=True)
class Int4Weight:
    """A linear's matrix `[out, in]` in torch's CPU int4 layout (group 32)."""

    packed: torch.Tensor  # uint8 [out, in / 2], `_convert_weight_to_int4pack_for_cpu`'s layout
    scale_zeros: torch.Tensor  # [in / 32, out, 2] compute dtype; w = (q - 8) * scale + zero
    dense: torch.Tensor | None  # [out, in] compute dtype, for steps of DENSE_FROM_ROWS rows or more

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)


@dataclass(slots=True)
class Int4Parts:
    """Load-time form, before packing: fused matrices (q|k|v, gate|up) concatenate these."""

    codes: torch.Tensor  # uint8 [out, in], 0..15
    scale: torch.Tensor  # float32 [out, in / 32]
    zero: torch.Tensor  # float32 [out, in / 32]
    sources: list[WeightTensor]  # for the dense copy, dequantized exactly as the dense path does

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])


Loaded = torch.Tensor | Int4Parts  # what `convert` returns
Weight = torch.Tensor | Int4Weight  # what `linear` takes


def convert(weight: WeightTensor, dtype: torch.dtype, device: torch.device, policy: QuantPolicy) -> Loaded:
    """A weight in its runtime form: `Int4Parts` where the int4 kernel applies, else a dense tensor."""
    rows = weight.shape[0] if len(weight.shape) == 2 else 0
    if policy.int4 and weight.dtype in INT4_TYPES and rows % 16 == 0 and rows > 0:
        return _int4_parts(weight)
    return to_tensor(weight, dtype, device)


def fuse(parts: list[Loaded]) -> Loaded:
    """Stack matrices along `out` (q|k|v, gate|up); dense as soon as one part is dense."""
    if all(isinstance(p, Int4Parts) for p in parts):
        int4 = [p for p in parts if isinstance(p, Int4Parts)]
        return Int4Parts(
            torch.cat([p.codes for p in int4]),
            torch.cat([p.scale for p in int4]),
            torch.cat([p.zero for p in int4]),
            [s for p in int4 for s in p.sources],
        )
    dense = [p for p in parts if isinstance(p, torch.Tensor)]
    like = dense[0]
    return torch.cat(
        [p if isinstance(p, torch.Tensor) else _dense(p, like.dtype, like.device) for p in parts]
    )


def finalize(loaded: Loaded, dtype: torch.dtype, device: torch.device, policy: QuantPolicy) -> Weight:
    if isinstance(loaded, torch.Tensor):
        return loaded
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(loaded.codes.to(torch.int32), 1)
    scale_zeros = torch.stack((loaded.scale.t(), loaded.zero.t()), dim=-1).to(dtype).contiguous()
    dense = _dense(loaded, dtype, device) if policy.dense_copy else None
    return Int4Weight(packed.to(device), scale_zeros.to(device), dense)


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ weight [out, in].T (+ bias) -> [T, out]."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    if weight.dense is not None and x.shape[0] >= DENSE_FROM_ROWS:
        return F.linear(x, weight.dense, bias)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight.packed, GROUP_SIZE, weight.scale_zeros)
    return out if bias is None else out + bias


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


def _dense(parts: Int4Parts, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.cat([to_tensor(s, dtype, device) for s in parts.sources])


def _int4_parts(weight: WeightTensor) -> Int4Parts:
    """GGUF Q4_0 / Q4_1 blocks (uint8 [out, bytes_per_row]) -> codes, scale, zero (table above)."""
    out, cols = weight.shape
    block = _BLOCK_BYTES[weight.dtype]
    raw = np.ascontiguousarray(weight.data).reshape(out, cols // GROUP_SIZE, block)  # [out, groups, bytes]
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0]).float()  # [out, groups]
    if weight.dtype == "Q4_1":
        m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0]).float()
        zero = m + 8 * d
    else:
        zero = torch.zeros_like(d)
    nibbles = torch.from_numpy(raw[..., block - 16 :].copy())  # [out, groups, 16]
    # Value j of a block is the low nibble of byte j, value j + 16 its high nibble.
    codes = torch.cat((nibbles & 0x0F, nibbles >> 4), dim=-1).reshape(out, cols)
    return Int4Parts(codes, d, zero, [weight])
