"""Importing the torch runner bounds oneDNN's and ideep's shape-keyed caches, so a server that sees a
new prompt length with every request stops growing (the soak benchmark's finding, issue 10).

The probe runs oneDNN's float32 inner product directly (the primitive kind a bf16 `F.linear` creates on
CPUs with native bf16): it creates one per shape on every x86 CPU, while a bf16 `F.linear` on an AVX2-only
CPU takes another path and creates none (there the bounded and the unbounded run both grew by 0)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from localchat import cpu_features

pytest.importorskip("torch")

PROBE = textwrap.dedent(
    """
    import ctypes, os, sys
    import torch
    if sys.argv[1] == "runner":
        import localchat.backends.torch.runner  # noqa: F401  (sets the cache bounds)
    print(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), os.environ.get("LRU_CACHE_CAPACITY"))
    def anon_mib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon"):
                return int(line.split()[1]) // 1024
    torch.set_num_threads(1)
    w = torch.randn(1536, 576).to_mkldnn()
    libc = ctypes.CDLL("libc.so.6")
    with torch.inference_mode():
        for i, rows in enumerate(range(30, 30 + 3 * 250, 3)):  # 250 distinct GEMM shapes
            torch._C._nn.mkldnn_linear(torch.randn(rows, 576).to_mkldnn(), w)
            if i in (99, 249):
                libc.malloc_trim(0)
                print(anon_mib())
    """
)


def growth(mode: str) -> tuple[str, int]:
    # Earlier tests in this process may have imported the runner, which sets both variables: drop them.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=300, env=env
    ).stdout.split("\n")
    return out[0], int(out[2]) - int(out[1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_runner_import_bounds_the_matmul_caches() -> None:
    settings, bounded = growth("runner")
    assert settings == "64 64"
    assert bounded < 30, bounded
    _, unbounded = growth("plain")
    if unbounded < 30 and "avx2" not in cpu_features.cpu_flags():
        # oneDNN below AVX2 (SSE4.1) keeps far smaller primitives: measured 9 MiB unbounded, too close to
        # the noise to tell the bound's effect; the bound itself was checked above
        pytest.skip(f"below AVX2 oneDNN's primitives grew by only {unbounded} MiB unbounded: unmeasurable")
    # 150 new shapes after the first 100: ~0.1 MiB each once the caches are full, ~0.6 without bounds.
    assert unbounded > bounded + 30, (unbounded, bounded)
