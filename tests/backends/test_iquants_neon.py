"""The NEON i-quant kernels (csrc/lc_iq_neon.h) tested on an x86 machine: tests/c/iq_neon_check.c, which
builds the library into itself, cross-compiled for aarch64 and run under qemu-aarch64 (user mode). It checks
every i-quant and ternary type and MXFP4: the NEON decoders give lc_iq_dec_row's codes and scales bit for bit
(the decoder the gguf.quants parity tests pin), the dot products give the integer sums, and lc_matmul on the
portable and NEON ISAs (row kernel for 1-4 rows, the panel GEMM for 8 and 13, odd sub-block counts, partial
panels, bf16 output) stays within float32 summation error of the float64 product.

Built twice: for armv8-a (the portable variant takes smull, the NEON ISA sdot under its target pragma, picked
at run time) and for armv8.2-a+dotprod (both sdot, as on Apple silicon); the armv8-a build also runs on an
emulated Cortex-A72 (no dot product), where the library must not pick the NEON ISA and the portable variant
must run without sdot. qemu's timings mean nothing, so nothing here is timed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CROSS, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
ENV = {"QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu", "PATH": "/usr/bin:/bin"}

pytestmark = [
    pytest.mark.slow,  # two cross builds of the library (~30 s each) and three qemu runs
    pytest.mark.skipif(
        not (CROSS and QEMU), reason="needs gcc-aarch64-linux-gnu and qemu-user (.ci/run installs both)"
    ),
]

# (-march, qemu -cpu or None for its default "max" CPU, the harness's first line, its check count)
CASES = [
    ("armv8-a", None, "portable variant smull, neon variant sdot (this CPU runs it)", 118624),
    ("armv8.2-a+dotprod", None, "portable variant sdot, neon variant sdot (this CPU runs it)", 118624),
    ("armv8-a", "cortex-a72", "portable variant smull, neon variant sdot (this CPU lacks it)", 61312),
]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The harness for each -march in CASES, built on first use."""
    folder = tmp_path_factory.mktemp("iq_neon")
    made: dict[str, Path] = {}
    for march in dict.fromkeys(case[0] for case in CASES):
        binary = folder / f"iq_neon_check-{march}"
        args = ["-O3", f"-march={march}", "-fopenmp", "-DLC_NO_PYTHON", "-Icsrc", "tests/c/iq_neon_check.c"]
        assert CROSS
        subprocess.run(
            [CROSS, *args, "-o", str(binary), "-lm"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        made[march] = binary
    return made


@pytest.mark.parametrize(
    ("march", "cpu", "variants", "checks"), CASES, ids=["armv8-a", "dotprod", "cortex-a72"]
)
def test_neon_iquants_decode_bit_for_bit_and_multiply_within_bounds(
    builds: dict[str, Path], march: str, cpu: str | None, variants: str, checks: int
) -> None:
    assert QEMU
    runner = [QEMU, *(["-cpu", cpu] if cpu else [])]
    run = subprocess.run([*runner, str(builds[march])], capture_output=True, text=True, timeout=600, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"dot products: {variants}" in run.stdout, run.stdout[-3000:]
    assert f"{checks} checks, all ok" in run.stdout, run.stdout[-3000:]
