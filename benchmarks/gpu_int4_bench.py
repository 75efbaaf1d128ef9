"""CUDA 4-bit matmul across step sizes: our Triton W4A16 kernel (triton_int4.py) and torch's tinygemm
int4 kernel, the two forms GGUF Q4_0/Q4_1 linears can take on a GPU, against a bf16 matmul on the same
shape; a shape/row count a kernel refuses is reported, not fatal. GB/s counts the 4-bit weights read.

python benchmarks/gpu_int4_bench.py            # Llama-3-8B's linears
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES_8B = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}


def time_ms(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    from benchmarks.attention_bench import timed

    return timed(fn, reps) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,16,64,256,2048")
    args = parser.parse_args()

    import torch

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| matrix [out, in] | rows | tinygemm ms | Triton ms | bf16 ms | Triton GB/s | Triton error |")
    print("|---|---|---|---|---|---|---|")
    for name, shape in SHAPES_8B.items():
        sweep(name, shape, [int(r) for r in args.rows.split(",")])
        torch.cuda.empty_cache()


def sweep(name: str, shape: tuple[int, int], row_counts: list[int]) -> None:
    import torch

    from localchat.backends.torch.cuda.quant_cuda import (
        cuda_int4_linear,
        dequantize_q4,
        pack_cuda,
        pack_triton,
        quantize_q4,
    )
    from localchat.backends.torch.cuda.triton_int4 import triton_int4_linear

    cuda = torch.device("cuda")
    out, cols = shape
    codes, scale, zero = quantize_q4(torch.randn(out, cols, device=cuda) * 0.02)
    tiny, ours = pack_cuda(codes, scale, zero, cuda), pack_triton(codes, scale, zero, cuda)
    ref_w = dequantize_q4(codes, scale, zero).bfloat16()
    weight_bytes = out * cols // 2 + 2 * 2 * out * cols // 32
    for rows in row_counts:
        x = torch.randn(rows, cols, device=cuda).bfloat16()
        try:
            tinygemm = f"{time_ms(lambda x=x: cuda_int4_linear(x, tiny)):.3f}"
        except Exception as exc:  # a refused launch is the finding
            tinygemm = f"fails: {str(exc).splitlines()[0][:50]}"
            torch.cuda.synchronize()
        got = triton_int4_linear(x, ours)
        err = float((got.float() - x.float() @ ref_w.float().t()).abs().max())
        triton_ms = time_ms(lambda x=x: triton_int4_linear(x, ours))
        bf16 = time_ms(lambda x=x: x @ ref_w.t())
        rate = weight_bytes / triton_ms / 1e6
        print(
            f"| {name} [{out}, {cols}] | {rows} | {tinygemm} | {triton_ms:.3f} | {bf16:.3f} | {rate:.0f} | {err:.3g} |"
        )


if __name__ == "__main__":
    main()
