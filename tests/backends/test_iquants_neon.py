"""The NEON i-quant kernels (csrc/lc_iq_neon.h) tested on an x86 machine: tests/c/iq_neon_check.c, which
builds the library into itself, cross-compiled for aarch64 and run under qemu-aarch64 (user mode). It checks
every i-quant and ternary type, MXFP4, NVFP4, Q1_0 and Q2_0: the NEON decoders give lc_iq_dec_row's codes and scales bit for bit
(the decoder the gguf.quants parity tests pin), the dot products give the integer sums, and lc_matmul on the
portable and NEON ISAs (row kernel for 1-4 rows, the panel GEMM for 8 and 13, odd sub-block counts, partial
panels, bf16 output) stays within float32 summation error of the float64 product.

Built with gcc for armv8-a (the portable variant takes smull, the NEON ISA sdot under its target pragma,
picked at run time) and for armv8.2-a+dotprod (both sdot); the armv8-a build also runs on an emulated
Cortex-A72 (no dot product), where the library must not pick the NEON ISA and the portable variant must run
without sdot. Where clang is installed, also with clang for armv8.2-a+dotprod (as Apple silicon builds:
the NEON ISA without a target pragma) and armv8-a (no NEON ISA built at all). qemu's timings mean
nothing, so nothing here is timed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CROSS, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
CLANG = next((c for c in ("clang", "clang-14", "clang-15", "clang-16") if shutil.which(c)), None)
ENV = {"QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu", "PATH": "/usr/bin:/bin"}

pytestmark = [
    pytest.mark.slow,  # up to four cross builds of the library (~30 s each) and five qemu runs
    pytest.mark.skipif(
        not (CROSS and QEMU), reason="needs gcc-aarch64-linux-gnu and qemu-user (.ci/run installs both)"
    ),
]

# (compiler, -march, qemu -cpu or None for its default "max" CPU, the harness's first line, its check count)
RUNS_NEON, NO_NEON = "(the NEON ISA runs here)", "(the NEON ISA does not run here)"
CASES = [
    ("gcc", "armv8-a", None, f"portable variant smull, neon variant sdot {RUNS_NEON}", 147280),
    ("gcc", "armv8.2-a+dotprod", None, f"portable variant sdot, neon variant sdot {RUNS_NEON}", 147280),
    ("gcc", "armv8-a", "cortex-a72", f"portable variant smull, neon variant sdot {NO_NEON}", 75640),
    ("clang", "armv8.2-a+dotprod", None, f"portable variant sdot, neon variant sdot {RUNS_NEON}", 147280),
    ("clang", "armv8-a", None, f"portable variant smull, neon variant none {NO_NEON}", 75640),
]
IDS = ["armv8-a", "dotprod", "cortex-a72", "clang-dotprod", "clang-armv8-a"]


def build(folder: Path, compiler: str, march: str) -> Path:
    """The harness built by `compiler` for `march` (OpenMP with gcc; clang's aarch64 libomp is not installed)."""
    binary = folder / f"iq_neon_check-{compiler}-{march}"
    if not binary.exists():
        tool = CROSS if compiler == "gcc" else CLANG
        assert tool
        cc = [tool, "-fopenmp"] if compiler == "gcc" else [tool, "--target=aarch64-linux-gnu"]
        args = [*cc, "-O3", f"-march={march}", "-DLC_NO_PYTHON", "-Icsrc", "tests/c/iq_neon_check.c"]
        subprocess.run(
            [*args, "-o", str(binary), "-lm"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    return binary


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the module's builds (the armv8-a gcc build serves two cases)."""
    return tmp_path_factory.mktemp("iq_neon")


@pytest.mark.parametrize(("compiler", "march", "cpu", "variants", "checks"), CASES, ids=IDS)
def test_neon_iquants_decode_bit_for_bit_and_multiply_within_bounds(
    folder: Path, compiler: str, march: str, cpu: str | None, variants: str, checks: int
) -> None:
    assert QEMU
    if compiler == "clang" and CLANG is None:
        pytest.skip("clang is not installed (apt-get install clang)")
    runner = [QEMU, *(["-cpu", cpu] if cpu else [])]
    run = subprocess.run(
        [*runner, str(build(folder, compiler, march))], capture_output=True, text=True, timeout=600, env=ENV
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"dot products: {variants}" in run.stdout, run.stdout[-3000:]
    assert f"{checks} checks, all ok" in run.stdout, run.stdout[-3000:]
