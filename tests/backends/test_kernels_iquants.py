"""The GGUF i-quants and ternary types on localchat's CPU kernels (csrc/lc_iquants.h).

- Dequantizing (embedding lookups) equals the `gguf` package's reference dequantizer bit for bit, on
  random valid blocks of every type (random codes, signs, sub-scales and grid indices).
- Matmul against the float64 product of the dequantized weights and the *same* 8-bit activations the
  kernels use (x ~ d * q per 32 values): only float32 accumulation error remains, at most
  (terms summed serially + a few) * 2^-24 * sum |w * x| per output (each 4-value lane is one term; the
  integer sums are exact). A wrong grid entry, sign or scale is off by orders of magnitude more.
- A tiny GGUF model in IQ4_XS / IQ4_NL (tests/helpers/iquants.py's encoders) keeps every matrix in blocks
  and follows the dequantized run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from localchat.backends.torch.cpu import kernels
from tests.helpers.iquants import IQ_QUANTIZERS, random_blocks
from tests.helpers.kernel_checks import (
    check_matmul_bound,
    compact_and_dequantized,
    follow_dequantized,
    tiny_model_matrices,
)
from tests.helpers.torch_models import tiny_hf_model

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

TYPES = sorted(kernels.IQ_TYPES)


def reference(qtype: str, blocks: np.ndarray, cols: int) -> np.ndarray:
    return np.asarray(dequantize(blocks, GGMLQuantizationType[qtype]), dtype=np.float32).reshape(-1, cols)


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_equals_gguf_bit_for_bit(qtype: str) -> None:
    ops = kernels.load("portable")
    assert ops is not None
    cols = 512
    blocks = random_blocks(qtype, 6, cols, seed=3)
    seg = kernels.Segment(qtype, torch.from_numpy(blocks))
    got = ops.dequantize_rows(seg, cols, torch.tensor([5, 0, 2]), torch.float32).numpy()
    want = reference(qtype, blocks, cols)[[5, 0, 2]]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.abs(got - want).max()


@pytest.mark.parametrize("isa", kernels.runnable_isas())
@pytest.mark.parametrize("qtype", TYPES)
def test_matmul_matches_the_dequantized_product(qtype: str, isa: str) -> None:
    """Decode (1-4 rows) and prefill shapes (a partial 4-row group, more rows than one 64-row chunk),
    float32 and bfloat16 activations and outputs."""
    ops = kernels.load(isa)
    assert ops is not None
    n, k = 37, 768
    blocks = random_blocks(qtype, n, k, seed=7)
    w = torch.from_numpy(reference(qtype, blocks, k)).double()
    check_matmul_bound(ops, qtype, blocks, w, rows=(1, 2, 3, 4, 70))


@pytest.mark.parametrize("qtype", sorted(IQ_QUANTIZERS))
def test_tiny_gguf_in_iq4_runs_on_blocks(tmp_path: Path, qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every matrix (linears, LM head, embedding) stays in IQ4 blocks and the run follows the dequantized
    one (prefill on the many-row path, then one-row decode steps)."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=256, intermediate_size=512)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    runs = compact_and_dequantized(path, monkeypatch)
    mats = tiny_model_matrices(runs[0])
    assert all(isinstance(m, kernels.BlockMatrix) for m in mats)
    assert {s.qtype for m in mats for s in m.segments} == {qtype}
    assert not any(s.packed_rows for m in mats for s in m.segments)
    follow_dequantized(*runs, steps=5)


@pytest.mark.parametrize(("qtype", "bytes_per_256"), [("IQ4_XS", 136), ("IQ4_NL", 144)])
def test_ram_estimate_sizes_iq4_files_as_stored(
    tmp_path: Path, qtype: str, bytes_per_256: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernels (on any ISA, x16 layout on or not: i-quants have no x16 form) the pre-load RAM
    check counts an i-quant file's matrices at their stored size, not expanded to 2 bytes a value."""
    from localchat.models.memory import compact_gguf_types, estimate
    from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    monkeypatch.delenv(kernels.LAYOUT_ENV, raising=False)
    cfg = tiny_config()
    weights = random_state_dict(cfg)
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", weights, cfg, qtype=qtype)
    matrix = sum(w.size for w in weights.values() if w.ndim == 2)
    norms = sum(w.size for w in weights.values() if w.ndim == 1)
    assert qtype in compact_gguf_types("bfloat16")
    assert estimate(path, 64, dtype="bfloat16").weights == matrix * bytes_per_256 // 256 + norms * 4


def _iq_check(compiler: str, isa: str, folder: Path, runner: list[str], env: dict[str, str]) -> str:
    """tests/c/iq_check.c and the library built by `compiler`, run for `isa`: its output."""
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
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
        ["-O2", "-Icsrc", "tests/c/iq_check.c", f"-L{folder}", "-llc", "-lm", "-o", str(folder / "iq_check")],
    ):
        subprocess.run([compiler, *args], cwd=repo, check=True, capture_output=True, text=True, timeout=300)
    run = subprocess.run(
        [*runner, str(folder / "iq_check"), str(kernels.ISAS.index(isa))],
        capture_output=True, text=True, timeout=300, env={**os.environ, "LD_LIBRARY_PATH": str(folder), **env},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert "756 cases, all ok" in run.stdout, run.stdout[-3000:]
    return run.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64") and shutil.which("gcc")),
    reason="needs gcc, gcc-aarch64-linux-gnu and qemu-user (.ci/run installs them)",
)
def test_aarch64_build_dequantizes_the_same_bits_and_multiplies_within_bounds(tmp_path: Path) -> None:
    """Under qemu-aarch64 (the NEON ISA: csrc/lc_iq_neon.h there) the C harness's matmuls stay within
    the float32 bound of the float64 product, and its dequantized values hash the same as this machine's
    native build (so the same as gguf.quants, which the tests above check natively)."""
    cross, qemu, gcc = (shutil.which(c) for c in ("aarch64-linux-gnu-gcc", "qemu-aarch64", "gcc"))
    assert cross and qemu and gcc
    (tmp_path / "arm").mkdir()
    (tmp_path / "x86").mkdir()
    arm = _iq_check(cross, "neon", tmp_path / "arm", [qemu], {"QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu"})
    native = _iq_check(gcc, "portable", tmp_path / "x86", [], {})

    def hashes(out: str) -> list[str]:
        return [line for line in out.splitlines() if " dequant " in line]

    assert len(hashes(arm)) == 12  # 11 i-quant and ternary types, MXFP4
    assert hashes(arm) == hashes(native)
