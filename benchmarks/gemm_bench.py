"""One block matrix on localchat's CPU kernels against torch's dense linear, GFLOP/s per row count.

    python -m benchmarks.gemm_bench --isa avx2 --rows 16 512 [--old path/to/other/_lckernels.so]
    python -m benchmarks.gemm_bench --rows 1 --threads 1 --cpu-time --types IQ3_XXS   # one-row decode

Each matrix is random GGUF blocks (tests/helpers/kquants.py for the K-quants, tests/helpers/iquants.py for
the i-quants); the dense columns are
`torch.nn.functional.linear` on its float32 and bfloat16 copies (what `LOCALCHAT_TORCH_QUANT=copies`
runs). "new" runs the file's blocks (`LOCALCHAT_KERNEL_LAYOUT=gguf`: the i-quants' own kernels, the
portable C reference for the legacy and K-quant types), "new x16" the same matrix repacked into the x16
layout where the ISA has kernels for it (the default load). `--old` times another build of the library in the same process, alternating with this one, so
the box's load hits both alike. Reports the median of `--reps` alternating rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from localchat.backends.torch.cpu import kernels
from localchat.kernels import library
from localchat.weights.lowbit import LOWBIT_TYPES, dequantize_lowbit
from tests.helpers import iquants, kquants
from tests.helpers.lowbit import random_lowbit_blocks

MATRICES = [
    ("Q4_K", 8192, 2048),
    ("Q6_K", 2048, 8192),
    ("Q4_0", 8192, 2048),
    ("Q8_0", 8192, 2048),
    ("Q5_K", 8192, 2048),
    ("Q5_0", 8192, 2048),
    ("Q5_1", 8192, 2048),
    ("Q3_K", 8192, 2048),
    ("Q2_K", 8192, 2048),
    ("IQ4_XS", 8192, 2048),
    ("IQ4_NL", 8192, 2048),
    ("IQ3_XXS", 8192, 2048),
    ("IQ3_S", 8192, 2048),
    ("IQ2_XXS", 8192, 2048),
    ("IQ2_XS", 8192, 2048),
    ("IQ2_S", 8192, 2048),
    ("IQ1_S", 8192, 2048),
    ("IQ1_M", 8192, 2048),
    ("TQ1_0", 8192, 2048),
    ("TQ2_0", 8192, 2048),
    ("NVFP4", 4096, 4096),  # docs/performance.md's low-bit timings are of this shape
    ("Q1_0", 4096, 4096),
    ("Q2_0", 4096, 4096),
    ("MXFP4", 4096, 4096),
]


def blocks(qtype: str, rows: int, cols: int) -> np.ndarray:
    values = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    if qtype in kquants.K_QUANTIZERS:
        return kquants.K_QUANTIZERS[qtype](values)
    if qtype in iquants.IQ_QUANTIZERS:
        return iquants.IQ_QUANTIZERS[qtype](values)
    if qtype in LOWBIT_TYPES:
        return random_lowbit_blocks(qtype, rows, cols, seed=0)
    if qtype in kernels.IQ_TYPES - {"TQ1_0", "TQ2_0"}:  # no encoder: random valid blocks time alike
        return iquants.random_blocks(qtype, rows, cols, seed=0)
    return quantize(values, GGMLQuantizationType[qtype])


def other_build(path: str, like: kernels.Kernels) -> kernels.Kernels:
    """Another build of the library, with this one's ctypes signatures, bound to the same ISA."""
    return kernels.Kernels(library.bind(path), like.isa)


def seconds(
    fn: Callable[[], object], budget: float = 0.3, clock: Callable[[], float] = time.perf_counter
) -> float:
    fn()
    runs, start = 0, clock()
    while True:
        fn()
        runs += 1
        took = clock() - start
        if took >= budget:
            return took / runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 512])
    ap.add_argument("--old", help="another build of _lckernels to compare with")
    ap.add_argument("--types", nargs="+", help="only these block types")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-dense", action="store_true", help="skip torch's float32/bfloat16 linear")
    ap.add_argument("--threads", type=int, help="torch's (and so the kernels') thread count")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the process's CPU time (with --threads 1: robust to other work on a busy box)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    ops = kernels.load(args.isa)
    assert ops is not None, "the kernels are not built"
    old = other_build(args.old, ops) if args.old else None
    kind = "CPU time" if args.cpu_time else "wall time"
    print(f"isa {ops.name}, {torch.get_num_threads()} threads, {kind}; GFLOP/s, median of {args.reps} rounds")
    for qtype, rows, cols in MATRICES:
        if args.types and qtype not in args.types:
            continue
        raw = blocks(qtype, rows, cols)
        matrix = kernels.BlockMatrix([kernels.Segment(qtype, torch.from_numpy(raw))], cols, ops)
        flat = (
            dequantize_lowbit(raw, qtype)
            if qtype in LOWBIT_TYPES
            else dequantize(raw, GGMLQuantizationType[qtype])
        )
        dense = torch.from_numpy(flat.reshape(rows, cols))
        x16 = ops.repack(matrix.segments[0], cols)  # the layout `auto` loads (csrc/lc_x16_layout.h)
        packed = kernels.BlockMatrix([x16], cols, ops) if x16.packed_rows else None
        for t in args.rows:
            x = torch.randn(t, cols)
            xb = x.bfloat16()
            runs: dict[str, Callable[[], object]] = {"new": partial(ops.matmul, x, matrix)}
            if packed is not None:
                runs["new x16"] = partial(ops.matmul, x, packed)
            if old is not None:
                runs["old"] = partial(old.matmul, x, matrix)
                if packed is not None:
                    runs["old x16"] = partial(old.matmul, x, kernels.BlockMatrix([x16], cols, old))
            if not args.no_dense:
                runs["dense f32"] = partial(torch.nn.functional.linear, x, dense)
                runs["dense bf16"] = partial(torch.nn.functional.linear, xb, dense.bfloat16())
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.reps):
                for name, fn in runs.items():
                    times[name].append(seconds(fn, clock=clock))
            flops = 2.0 * t * rows * cols
            cells = ", ".join(f"{name} {flops / statistics.median(v) / 1e9:.1f}" for name, v in times.items())
            print(f"{qtype} {rows}x{cols} t={t}: {cells}", flush=True)


if __name__ == "__main__":
    main()
