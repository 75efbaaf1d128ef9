"""CI runs on one CPU; the CPU-dependent tests run again here as the others (LOCALCHAT_EMULATE_CPU, plus
torch's own variables from cpu_features.torch_env, in a fresh pytest process since torch reads them at
import): AVX2-only (most laptops, Zen 2/3: the avx2 kernels, float32 compute), AVX-512 without VNNI or
BF16 (the same kernels; torch's AVX-512 paths with float32), and a CPU below AVX2 (portable C). An
emulated CPU only takes features away, so a run needs a host that has them, and a host that already is
that CPU skips it (its own suite covers it). NEON runs under qemu in test_kernels_neon.py.

Each run is a selection, to keep this under a few minutes on 2 cores: the tests whose expectations
depend on the CPU's choices (`auto` loads, x16 packing, the RAM estimate, torch's int4 kernel, oneDNN),
not the ones that already run every ISA by name on any host (test_kernels_matmul.py and the like).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from localchat import cpu_features

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="emulation narrows /proc/cpuinfo's flags"
    ),
]

B = "tests/backends/"
# Every emulated CPU: the auto choices through a real load, and the RAM estimate against what it holds.
COMMON = [
    B + "test_cpu_choices.py",
    B + "test_memory_estimate_per_cpu.py",
    "tests/unit/test_model_memory_gguf.py",
]
RUNS: dict[str, list[str]] = {
    # where issue 36's failures were: x16 on AVX2, torch's int4 kernel at AVX2 width, oneDNN's primitives
    "avx2": [
        *COMMON,
        B + "test_kernels_model.py::test_tiny_gguf_runs_on_blocks_and_tracks_the_dequantized_run",
        B + "test_kernels_model.py::test_policy_picks_the_kernels_on_cpu",
        B + "test_decode_step.py",
        B + "test_torch_real_model.py::test_int4_linears_track_the_dequantized_bf16_run",
        B + "test_onednn_caches.py",
    ],
    # float32 compute where bf16 is not native although AVX-512 is
    "avx512": [*COMMON, B + "test_kernels_model.py::test_policy_picks_the_kernels_on_cpu"],
    "portable": [
        *COMMON,
        B + "test_kernels_model.py::test_tiny_gguf_runs_on_blocks_and_tracks_the_dequantized_run",
        B + "test_kernels_model.py::test_policy_picks_the_kernels_on_cpu",
        B + "test_decode_step.py",
    ],
}
# Settings of the outer run that would override the emulated CPU's own choices.
_CLEARED = {
    "LOCALCHAT_KERNELS",
    "LOCALCHAT_KERNEL_LAYOUT",
    "LOCALCHAT_TORCH_QUANT",
    "LOCALCHAT_TORCH_ATTENTION",
}
_CLEARED |= {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", cpu_features.EMULATE_ENV}


def _same_choices(flags: frozenset[str], other: frozenset[str]) -> bool:
    return cpu_features.runnable_isas(flags) == cpu_features.runnable_isas(other) and (
        cpu_features.compute_dtype(flags) == cpu_features.compute_dtype(other)
    )


@pytest.mark.parametrize("cpu", sorted(RUNS))
def test_cpu_dependent_tests_pass_as_another_cpu(cpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    host = cpu_features.host_flags()
    profile = cpu_features.EMULATED[cpu]
    if not profile <= host:
        pytest.skip(f"this CPU lacks {sorted(profile - host)}: it cannot run as {cpu}")
    if _same_choices(host, profile):
        pytest.skip(f"this CPU chooses as {cpu} does: the suite itself runs its tests")
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED} | cpu_features.torch_env(cpu)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", *RUNS[cpu]]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    seconds = time.monotonic() - start
    summary = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?) in [\d.]+s", done.stdout, flags=re.M)
    with capsys.disabled():  # the per-CPU result belongs in the CI log even when it passes
        print(f"\n[{cpu}] {summary[-1] if summary else 'no summary'} in {seconds:.0f} s")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert summary and "passed" in summary[-1], summary  # not everything skipped
