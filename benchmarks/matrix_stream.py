"""Decode (one activation row) time and GB/s of each weight matrix of a real GGUF, as the engine runs it.

    python benchmarks/matrix_stream.py --model /tmp/iq8b/llama8b-iq4_xs.gguf [--threads 1 2] [--head]
        [--old path/to/other/_lckernels.so]

Takes `--layers` consecutive layers' attention and MLP matrices (enough that they stream from DRAM, not
the last-level cache), reads the i-quant ones in place from the mapped file and repacks the legacy and
K-quant ones into the x16 layout, as the loader does, and times `lc_matmul` on one quantized activation
row, median of `--reps` passes. `--old` alternates another build of the library in the same process, so
the box's load hits both alike. Issue #34: the 8B IQ4_XS file's matrices ran at ~11 GB/s a core against
~41 GB/s that a plain read reaches (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from ctypes import CDLL
from pathlib import Path

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat.kernels import library
from localchat.kernels.blocks import BLOCKS, X16_TYPES

X16 = 0x100  # csrc/lc_kernels.h's LC_X16
ISAS = {"portable": 0, "avx2": 1, "avx512vnni": 2}
NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

# (label, type id for lc_matmul, weights, rows n, columns k, row bytes, file bytes)
Matrix = tuple[str, int, np.ndarray, int, int, int, int]


def prepare(lib: CDLL, tensor: object) -> Matrix:
    """One GGUF tensor as the engine reads it: x16 panels where the type has them, else the file's rows."""
    k, n = (int(v) for v in tensor.shape[:2])  # type: ignore[attr-defined]
    qtype = tensor.tensor_type.name  # type: ignore[attr-defined]
    rows = np.asarray(tensor.data).reshape(n, -1)  # type: ignore[attr-defined]
    tid = BLOCKS[qtype][0]
    if qtype not in X16_TYPES:
        return qtype, tid, rows, n, k, rows.shape[1], rows.nbytes
    packed = np.empty(lib.lc_x16_bytes(tid, n, k), np.uint8)
    if lib.lc_x16_repack(tid, rows.ctypes.data, n, k, rows.shape[1], packed.ctypes.data, 1):
        raise SystemExit(f"lc_x16_repack refused {qtype} {n}x{k}")
    return qtype + " x16", tid | X16, packed, n, k, 0, rows.nbytes


def time_pass(lib: CDLL, isa: int, mats: list[tuple[str, Matrix]], acts: dict, nth: int) -> dict[str, float]:
    """Seconds of each matrix, one pass over all of them (sums per matrix name over the layers)."""
    out = np.empty(max(m[3] for _, m in mats), np.float32)
    took: dict[str, float] = {}
    for name, (_, tid, data, n, k, row_bytes, _) in mats:
        q8, xd, xs = acts[k]
        start = time.perf_counter()
        rc = lib.lc_matmul(
            isa,
            tid,
            data.ctypes.data,
            n,
            k,
            row_bytes,
            q8.ctypes.data,
            xd.ctypes.data,
            xs.ctypes.data,
            1,
            out.ctypes.data,
            0,
            n,
            nth,
        )
        took[name] = took.get(name, 0.0) + time.perf_counter() - start
        if rc:
            raise SystemExit(f"lc_matmul failed ({rc}) on {name}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--isa", default="avx512vnni", choices=sorted(ISAS))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layers", type=int, default=6, help="consecutive layers, from the middle of the model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--head", action="store_true", help="also the output matrix (LM head)")
    ap.add_argument("--old", help="another build of _lckernels to alternate with")
    args = ap.parse_args()
    current = library.library()
    if current is None:
        raise SystemExit("no compiled kernels: python setup.py build_ext --inplace")
    libs = {"new": current, **({"old": library.bind(args.old)} if args.old else {})}
    isa = ISAS[args.isa]
    tensors = {t.name: t for t in GGUFReader(args.model).tensors}
    count = 1 + max(int(name.split(".")[1]) for name in tensors if name.startswith("blk."))
    first = max(0, count // 2 - args.layers // 2)
    names = [f"blk.{i}.{m}.weight" for i in range(first, first + args.layers) for m in NAMES]
    names += ["output.weight"] if args.head and "output.weight" in tensors else []
    mats = [(name.split(".")[-2], prepare(current, tensors[name])) for name in names if name in tensors]
    acts = {}
    rng = np.random.default_rng(0)
    for k in {m[4] for _, m in mats}:
        x = rng.standard_normal(k).astype(np.float32)
        q8, xd, xs = (
            np.empty(k, np.int8),
            np.empty(k // 4, np.float32),
            np.empty(k // 16 + k // 4, np.float32),
        )
        if current.lc_quantize(
            isa, x.ctypes.data, 0, 1, k, k, q8.ctypes.data, xd.ctypes.data, xs.ctypes.data, 1
        ):
            raise SystemExit(f"lc_quantize refused k={k} on {args.isa}")
        acts[k] = (q8, xd, xs)
    info = {name: (m[0], m[3], m[4], m[6]) for name, m in mats}
    per_name = {name: sum(1 for n, _ in mats if n == name) for name in info}
    for nth in args.threads:
        runs: dict[str, list[dict[str, float]]] = {tag: [] for tag in libs}
        for rep in range(args.reps + 1):  # the first pass faults the file's pages in: not counted
            for tag, lib in libs.items():
                took = time_pass(lib, isa, mats, acts, nth)
                if rep:
                    runs[tag].append(took)
        load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
        for tag in libs:
            total_s = total_b = 0.0
            for name, (qtype, n, k, nbytes) in info.items():
                sec = statistics.median(r[name] for r in runs[tag]) / per_name[name]
                total_s, total_b = total_s + sec * per_name[name], total_b + nbytes * per_name[name]
                print(
                    f"{tag} {nth} thr {name:12s} {qtype:9s} {n:6d}x{k:5d} {sec * 1e3:7.3f} ms {nbytes / sec / 1e9:5.1f} GB/s"
                )
            print(f"{tag} {nth} thr all: {total_b / total_s / 1e9:.1f} GB/s (load average {load})")


if __name__ == "__main__":
    main()
