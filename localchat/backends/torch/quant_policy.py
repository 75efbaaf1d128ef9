"""Which weight mode a torch runner loads quantized matrices in (`QuantPolicy`): `LOCALCHAT_TORCH_QUANT`
narrowed to what the device, the compute dtype, the kernels' ISA and the free RAM run well, and the
kernels' activation rounding (`LOCALCHAT_KERNEL_ACTIVATIONS`). quant.py describes the modes and converts
the weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from localchat.backends.torch.cpu import isq as isq_blocks
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.cuda.quant_cuda import cuda_int4_available, cuda_int4_kernel
from localchat.config import backend_choices, backend_variable
from localchat.errors import BackendUnavailableError

QUANT_ENV = "LOCALCHAT_TORCH_QUANT"
QUANT_MODES = backend_choices(QUANT_ENV)  # auto, int4, dequant, copies
DENSE_COPY_RAM_FRACTION = 0.4  # of MemAvailable: dense copies only when all of them fit well within it
# Kernel ISAs whose many-row (prefill, batch) path is worth more than dense copies: their x16 kernels
# (csrc/lc_x16_avx512.h, lc_x16_avx2.h, lc_x16_neon.h; AVX2's on par with a dense float32 GEMM at a
# fraction of the memory). The file's blocks as stored run portable C on every ISA.
FAST_GEMM_ISAS = ("avx512vnni", "avx2", "neon")
ACTIVATIONS_ENV = "LOCALCHAT_KERNEL_ACTIVATIONS"
# q8: 8 bits per 32 activations (llama.cpp's numerics); precise: plus the 8-bit residual (lc_linear);
# auto: precise for small models, q8 for the rest
ACTIVATION_MODES = backend_choices(ACTIVATIONS_ENV)  # auto, q8, precise
# A small model: its linears would take at most this much in bf16 (~0.5B parameters). `auto` rounds its
# activations precisely: SmolLM2-135M answered "What is the capital of France?" with "L'Etoile, la
# Marseillaise, la femme, ..." on q8 activations and "The capital of France is Paris." on precise ones, as
# the exact dequantized model does (bigger models run q8, like llama.cpp). Decode is hardly slower (~10%);
# prefill on twice the integer work is (~380 vs ~640 tok/s, still above llama.cpp's ~340 on the same box).
# `LOCALCHAT_TORCH_QUANT=copies` buys it back (bf16 copies: ~950 tok/s for ~210 MB more).
SMALL_MODEL_BYTES = 1 << 30


@dataclass(slots=True, frozen=True)
class QuantPolicy:
    kernels: cpu_kernels.Kernels | None = None  # GGUF blocks kept and run by our CPU kernels
    int4: bool = False  # Q4_0 / Q4_1 linears through the int4 kernel
    dense_copy: bool = False  # ...also keeping a bf16 copy for many-row steps
    block_copies: bool = False  # GGUF block matrices on our kernels keep a bf16 copy for many-row steps
    cuda: bool = False  # ...in a CUDA kernel's layout (quant_cuda.py) instead of the CPU one
    cuda_kernel: str = "tinygemm"  # which: "tinygemm" (torch's), "triton" (triton_int4.py) or "both"
    isq: bool = False  # unquantized linears are quantized to 4 bits at load (`--isq q4`)
    isq_blocks: str | None = None  # `--isq q8_0|q4_k|q4_0`: unquantized matrices become these blocks (isq.py)

    @property
    def precise(self) -> bool:
        """Block matrices round activations twice (8 bits, then the residual: ~15 bits; lc_linear)."""
        return self.kernels is not None and self.kernels.precise


def int4_kernel_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


def pick_policy(
    device: torch.device,
    dtype: torch.dtype,
    dense_bytes: int,
    available: int | None,
    isq: str | None = None,
) -> QuantPolicy:
    """The env's mode, narrowed to what this device/dtype runs fast; `dense_bytes` estimates the dense
    copies (the model's linears in `dtype`), `available` the free RAM (None: unknown); `isq`: "q4",
    "q8_0", "q4_k" or "q4_0" to quantize unquantized linears at load."""
    activations = backend_variable(ACTIVATIONS_ENV)
    policy = _pick_mode(device, dtype, dense_bytes, available, isq)
    if activations == "auto":
        activations = "precise" if dense_bytes <= SMALL_MODEL_BYTES else "q8"
    if policy.kernels is None or activations != "precise":
        return policy
    return replace(policy, kernels=cpu_kernels.Kernels(policy.kernels.lib, policy.kernels.isa, precise=True))


def _pick_mode(
    device: torch.device, dtype: torch.dtype, dense_bytes: int, available: int | None, isq: str | None
) -> QuantPolicy:
    mode = backend_variable(QUANT_ENV)
    if isq in isq_blocks.BLOCK_TYPES:
        return _block_isq_policy(isq, device, mode)
    on_cuda = dtype == torch.bfloat16 and cuda_int4_available(device)
    usable = on_cuda or (device.type == "cpu" and dtype == torch.bfloat16 and int4_kernel_available())
    if isq is not None and (not usable or mode == "dequant"):
        raise BackendUnavailableError(
            f"--isq {isq} needs bfloat16 compute with an int4 kernel: a CUDA GPU of compute capability "
            "8.0+, or a CPU with native bf16 (AVX512-BF16/AMX); this run uses "
            f"{dtype} on {device}{' with ' + QUANT_ENV + '=dequant' if mode == 'dequant' else ''}."
        )
    if mode in ("auto", "int4") and isq is None and device.type == "cpu" and dtype == torch.float32:
        # fp32 compute (CPUs without native bf16: most AVX2-only ones): every GGUF matrix on our kernels,
        # which take fp32 activations, never a dense fp32 copy (4 bytes a weight: a 1B Q4_K_M file took
        # 5.2 GB). `auto` does so where the kernels' many-row path is fast; `dequant` is the exact path.
        ops = cpu_kernels.load()
        if ops is not None and (mode == "int4" or ops.name in FAST_GEMM_ISAS):
            return QuantPolicy(kernels=ops)
    if mode == "dequant" or not usable:
        return QuantPolicy()
    wants_isq = isq is not None
    if on_cuda:  # device memory is the scarce resource: never a dense copy
        kernel = cuda_int4_kernel(
            dense_bytes * 9 // 32, torch.cuda.mem_get_info(device)[0]
        )  # 4 bits + bf16 scale/zero per 32: ~4.5
        return QuantPolicy(int4=True, cuda=True, isq=wants_isq, cuda_kernel=kernel)
    fits = available is None or dense_bytes <= available * DENSE_COPY_RAM_FRACTION
    ops = cpu_kernels.load() if device.type == "cpu" else None
    if ops is not None:  # GGUF blocks on our kernels; --isq weights still go to torch's int4 kernel
        # Block matrices, Q4_0/Q4_1 included, keep bf16 copies in `copies`, and in `auto` where our many-row
        # path is the slow one (portable C: the AVX2, AVX-512 VNNI and NEON x16 GEMMs run prefill without them).
        copies_pay = ops.name not in FAST_GEMM_ISAS
        return QuantPolicy(
            kernels=ops,
            int4=wants_isq,
            # int4 matrices (torch's kernel is compute-bound at many rows) keep copies where RAM allows
            dense_copy=fits and mode in ("auto", "copies"),
            block_copies=fits and (mode == "copies" or (mode == "auto" and copies_pay)),
            isq=wants_isq,
        )
    if mode == "int4":
        return QuantPolicy(int4=True, isq=wants_isq)
    return QuantPolicy(int4=True, dense_copy=fits, isq=wants_isq)


def _block_isq_policy(isq: str, device: torch.device, mode: str) -> QuantPolicy:
    """`--isq q8_0|q4_k|q4_0` runs only on our CPU kernels: refused (not silently dense) where they cannot run."""
    ops = cpu_kernels.load() if device.type == "cpu" and mode != "dequant" else None
    if ops is None:
        why = (
            f"this run uses {device}"
            if device.type != "cpu"
            else f"{QUANT_ENV}=dequant is set"
            if mode == "dequant"
            else f"the kernels are off or not built ({cpu_kernels.KERNELS_ENV}, `python setup.py build_ext`)"
        )
        raise BackendUnavailableError(
            f"--isq {isq} runs on localchat's compiled CPU kernels, and {why}. Use --device cpu with the "
            "kernels built, or --isq q4 (torch's int4 kernel, also on CUDA)."
        )
    # No dense copies and no int4 detour: the point of --isq is memory; one block form serves every step.
    return QuantPolicy(kernels=ops, isq_blocks=isq_blocks.BLOCK_TYPES[isq])
