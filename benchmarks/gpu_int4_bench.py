"""CUDA 4-bit matmul across step sizes: torch's tinygemm int4 kernel (what GGUF Q4_0/Q4_1 linears run on
a GPU) against a bf16 matmul on the same shape (the dense bound) and against dequantizing the 4-bit
codes to bf16 first; a shape/row count the kernel refuses is reported, not fatal.

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
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,16,64,256,1024,2048,4096")
    args = parser.parse_args()

    import torch

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| matrix [out, in] | rows | int4 ms | dequant + bf16 ms | bf16 ms | int4 error |")
    print("|---|---|---|---|---|---|")
    for name, shape in SHAPES_8B.items():
        sweep(name, shape, [int(r) for r in args.rows.split(",")])
        torch.cuda.empty_cache()


def sweep(name: str, shape: tuple[int, int], row_counts: list[int]) -> None:
    import torch

    from localchat.backends.torch.quant_cuda import cuda_int4_linear, dequantize_q4, pack_cuda, quantize_q4

    cuda = torch.device("cuda")
    out, cols = shape
    codes, scale, zero = quantize_q4(torch.randn(out, cols, device=cuda) * 0.02)
    packed = pack_cuda(codes, scale, zero, cuda)
    ref_w = dequantize_q4(codes, scale, zero).bfloat16()
    for rows in row_counts:
        x = torch.randn(rows, cols, device=cuda).bfloat16()
        try:
            got = cuda_int4_linear(x, packed)
            torch.cuda.synchronize()
            err = float((got.float() - x.float() @ ref_w.float().t()).abs().max())
            int4 = f"{time_ms(lambda x=x: cuda_int4_linear(x, packed)):.3f}"
        except Exception as exc:  # a refused launch is the finding
            int4, err = f"fails: {str(exc).splitlines()[0][:60]}", float("nan")
            torch.cuda.synchronize()
        deq = time_ms(lambda x=x: x @ dequantize_q4(codes, scale, zero).bfloat16().t(), reps=5)
        bf16 = time_ms(lambda x=x: x @ ref_w.t())
        print(f"| {name} [{out}, {cols}] | {rows} | {int4} | {deq:.3f} | {bf16:.3f} | {err:.3g} |")


if __name__ == "__main__":
    main()
