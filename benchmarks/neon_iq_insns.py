"""Instructions executed per weight by the i-quant kernels on aarch64, counted under qemu-aarch64.

No ARM machine is at hand, and qemu's timings mean nothing, but the number of guest instructions a kernel
executes is exact under emulation: this script cross-compiles the library (armv8-a, so the `portable`
variant takes lc_iq_neon.h's smull path and the `neon` ISA its sdot path) and
benchmarks/c/iq_matmul_reps.c, runs them under qemu-aarch64 with benchmarks/c/insn_count_plugin.c, and
prints a markdown table of instructions per weight and activation row (64 x 4096 weights, one thread,
the difference of 3 and 1 calls). `--before REV` adds the kernels of a git revision (the NEON ISA there),
e.g. the portable C the i-quants ran before lc_iq_neon.h. Instruction counts are not time: a tbl, an sdot
and a scalar add all count one, and memory stalls count nothing.

Needs gcc, gcc-aarch64-linux-gnu and qemu-user (the qemu build must support -plugin, as Debian's does).
Usage: python benchmarks/neon_iq_insns.py [--before REV] [--rows 1 16] [--types Q1_0 Q2_0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "c"
# name, GGML type id, values per block, bytes per block
TYPES = [
    ("IQ4_NL", 20, 32, 18),
    ("IQ4_XS", 23, 256, 136),
    ("MXFP4", 39, 32, 17),
    ("IQ3_XXS", 18, 256, 98),
    ("IQ3_S", 21, 256, 110),
    ("IQ2_XXS", 16, 256, 66),
    ("IQ2_XS", 17, 256, 74),
    ("IQ2_S", 22, 256, 82),
    ("IQ1_S", 19, 256, 50),
    ("IQ1_M", 29, 256, 56),
    ("TQ1_0", 34, 256, 54),
    ("TQ2_0", 35, 256, 66),
    ("NVFP4", 40, 64, 36),
    ("Q1_0", 41, 128, 18),
    ("Q2_0", 42, 64, 18),
]
WEIGHTS = 64 * 4096
PORTABLE, NEON = 0, 3


def build(csrc: Path, folder: Path) -> Path:
    """The library from `csrc` and the repetition harness against it, for armv8-a: the harness's path."""
    folder.mkdir(parents=True, exist_ok=True)
    cross = ["aarch64-linux-gnu-gcc", "-march=armv8-a"]
    flags = ["-O3", "-fopenmp", "-shared", "-fPIC", "-DLC_NO_PYTHON"]
    lib = [*cross, *flags, str(csrc / "lc_kernels.c"), "-o", str(folder / "liblc.so"), "-lm"]
    subprocess.run(lib, check=True)
    harness = folder / "iq_matmul_reps"
    subprocess.run(
        [
            *cross,
            "-O2",
            f"-I{csrc}",
            str(HERE / "iq_matmul_reps.c"),
            f"-L{folder}",
            "-llc",
            "-o",
            str(harness),
        ],
        check=True,
    )
    return harness


def count(
    plugin: Path, harness: Path, isa: int, kind: tuple[str, int, int, int], rows: int, reps: int
) -> int:
    """Guest instructions of one run of the harness."""
    env = {**os.environ, "QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu", "LD_LIBRARY_PATH": str(harness.parent)}
    args = [str(a) for a in (kind[1], isa, kind[2], kind[3], rows, reps)]
    run = subprocess.run(
        ["qemu-aarch64", "-plugin", str(plugin), str(harness), *args],
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
        check=True,
    )
    line = next(x for x in run.stderr.splitlines() if x.startswith("insns "))
    return int(line.split()[1])


def per_weight(plugin: Path, harness: Path, isa: int, kind: tuple[str, int, int, int], rows: int) -> float:
    """Instructions per weight and activation row of one lc_matmul call (3 calls minus 1)."""
    extra = count(plugin, harness, isa, kind, rows, 3) - count(plugin, harness, isa, kind, rows, 1)
    return extra / (2 * WEIGHTS * rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git revision whose kernels to count too (its NEON ISA)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="activation rows per call")
    parser.add_argument("--types", nargs="+", help="only these types")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plugin = work / "libinsn.so"
        plugin_cmd = ["gcc", "-O2", "-shared", "-fPIC", str(HERE / "insn_count_plugin.c"), "-o", str(plugin)]
        subprocess.run(plugin_cmd, check=True)
        now = build(REPO / "csrc", work / "now")
        before = None
        if args.before:
            archive = subprocess.run(
                ["git", "archive", args.before, "csrc"], cwd=REPO, capture_output=True, check=True
            )
            with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
                tar.extractall(work / "before", filter="data")
            before = build(work / "before" / "csrc", work / "before-build")
        head = "| type | rows | " + (f"{args.before} (NEON ISA) | " if before else "") + "smull | sdot |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for kind in TYPES:
            if args.types and kind[0] not in args.types:
                continue
            for rows in args.rows:
                cells = [f"{per_weight(plugin, before, NEON, kind, rows):.2f}"] if before else []
                cells += [f"{per_weight(plugin, now, isa, kind, rows):.2f}" for isa in (PORTABLE, NEON)]
                print(f"| {kind[0]} | {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
