"""ARM NEON's x16 kernel (csrc/lc_x16_neon.h) tested on an x86 machine: the library and tests/c/x16_check.c
cross-compiled for aarch64 and run under qemu-aarch64 (user mode; its default CPU has the dot product),
against the portable kernels on the same GGUF blocks. The same harness runs natively for this CPU's
x86 x16 ISAs, so a harness that passed a broken kernel would show there too."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from localchat.backends.torch.cpu import kernels

REPO = Path(__file__).resolve().parents[2]
CROSS, QEMU, GCC = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64"), shutil.which("gcc")
ISA_IDS = {name: i for i, name in enumerate(kernels.ISAS)}
CASES = "300 cases, all ok"  # 10 types x 3 row counts x 2 widths x 5 activation row counts


def build_and_run(compiler: str, isa: str, folder: Path, runner: list[str], env: dict[str, str]) -> str:
    library = folder / "liblc.so"
    for args in (
        [
            "-O3",
            "-fopenmp",
            "-shared",
            "-fPIC",
            "-DLC_NO_PYTHON",
            "csrc/lc_kernels.c",
            "-o",
            str(library),
            "-lm",
        ],
        [
            "-O2",
            "-Icsrc",
            "tests/c/x16_check.c",
            f"-L{folder}",
            "-llc",
            "-lm",
            "-o",
            str(folder / "x16_check"),
        ],
    ):
        subprocess.run([compiler, *args], cwd=REPO, check=True, capture_output=True, text=True, timeout=300)
    run = subprocess.run(
        [*runner, str(folder / "x16_check"), str(ISA_IDS[isa])],
        capture_output=True, text=True, timeout=300, env={**os.environ, "LD_LIBRARY_PATH": str(folder), **env},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    return run.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    not (CROSS and QEMU), reason="needs gcc-aarch64-linux-gnu and qemu-user (.ci/run installs both)"
)
def test_neon_x16_kernel_matches_the_portable_blocks_under_qemu(tmp_path: Path) -> None:
    assert CROSS and QEMU
    out = build_and_run(CROSS, "neon", tmp_path, [QEMU], {"QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu"})
    assert CASES in out, out[-3000:]


@pytest.mark.skipif(GCC is None, reason="needs gcc")
@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512vnni") if i in kernels.runnable_isas()])
@pytest.mark.slow  # compiles and runs the C harness: out of the fast tier, still in CI
def test_the_harness_passes_this_cpus_x16_kernels(tmp_path: Path, isa: str) -> None:
    assert GCC
    assert CASES in build_and_run(GCC, isa, tmp_path, [], {})
