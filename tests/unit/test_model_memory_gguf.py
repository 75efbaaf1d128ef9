"""The pre-load RAM check sizes a quantized GGUF the way the backend will hold it: tensor by tensor, the
types localchat's compiled kernels read in place at their size in the file (a Q4_K_M mix of Q4_K and
Q6_K is no bigger in RAM than on disk), everything else at 2 bytes per value once expanded to bf16.
Expected sizes are worked out from the formats (Q4_K: 144 bytes per 256 values; F32 norms), not from
the code under test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from localchat.models.memory import compact_gguf_types, estimate
from localchat.weights.x16 import x16_active
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

KERNELS_BUILT = importlib.util.find_spec("localchat._lckernels") is not None


# bytes per 256 values in the file and in the x16 layout (K-quants' 6-bit scales and mins spread to bytes)
BYTES_PER_256 = {
    "Q5_0": (176, 176),
    "Q5_1": (192, 192),
    "Q2_K": (84, 84),
    "Q3_K": (110, 114),
    "Q4_K": (144, 148),
    "Q5_K": (176, 180),
    "Q6_K": (210, 210),
}


def _q4_k_file(tmp_path: Path, qtype: str = "Q4_K") -> tuple[Path, int, int, int]:
    """A tiny `qtype` llama GGUF and (values in matrices, values in norms, bytes of its tensors)."""
    cfg = tiny_config()
    weights = random_state_dict(cfg)
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", weights, cfg, qtype=qtype)
    matrix = sum(w.size for w in weights.values() if w.ndim == 2)
    norms = sum(w.size for w in weights.values() if w.ndim == 1)
    assert all(w.shape[-1] % 256 == 0 for w in weights.values() if w.ndim == 2)  # every row is blocks
    return path, matrix, norms, matrix * BYTES_PER_256[qtype][0] // 256 + norms * 4


@pytest.mark.skipif(not KERNELS_BUILT, reason="the compiled kernels are not built in this install")
def test_k_quant_file_is_sized_as_stored_with_the_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCALCHAT_KERNELS", raising=False)
    monkeypatch.setenv("LOCALCHAT_KERNEL_LAYOUT", "gguf")
    path, _, _, stored = _q4_k_file(tmp_path)
    assert "Q4_K" in compact_gguf_types() and "Q6_K" in compact_gguf_types()
    assert estimate(path, 64).weights == stored
    assert stored < path.stat().st_size  # the rest of the file is metadata and the vocabulary


@pytest.mark.skipif(not x16_active(), reason="the kernels do not repack on this CPU (no AVX2)")
@pytest.mark.parametrize("qtype", sorted(BYTES_PER_256))
def test_block_file_is_sized_in_the_x16_layout_where_the_kernels_repack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, qtype: str
) -> None:
    """Repacked into panels of 16 rows (csrc/lc_x16_layout.h), Q3_K takes 114 bytes per 256 values, Q4_K
    148 and Q5_K 180 (their 6-bit scales spread to bytes), Q5_0, Q5_1, Q2_K and Q6_K what the file does; every
    tiny matrix has a multiple of 16 rows, so no panel padding."""
    monkeypatch.delenv("LOCALCHAT_KERNELS", raising=False)
    monkeypatch.delenv("LOCALCHAT_KERNEL_LAYOUT", raising=False)
    path, matrix, norms, stored = _q4_k_file(tmp_path, qtype)
    assert estimate(path, 64).weights == matrix * BYTES_PER_256[qtype][1] // 256 + norms * 4
    assert estimate(path, 64).weights < stored * 1.04  # at most Q3_K's 4 bytes in 110


def test_k_quant_file_is_sized_dequantized_without_the_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALCHAT_KERNELS", "off")
    path, matrix, norms, stored = _q4_k_file(tmp_path)
    assert compact_gguf_types() == frozenset({"Q4_0", "Q4_1"})
    weights = estimate(path, 64).weights
    assert weights == matrix * 2 + norms * 4
    assert weights > 3 * stored  # bf16 is 16 bits a value against Q4_K's 4.5


def test_unreadable_gguf_falls_back_to_the_filename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged header is the load's to report; the estimate still answers from the name's type."""
    monkeypatch.setenv("LOCALCHAT_KERNELS", "off")
    path = tmp_path / "broken-Q8_0.gguf"
    path.write_bytes(np.zeros(4096, dtype=np.uint8).tobytes())
    assert estimate(path, 64).weights == int(4096 * 16 / 8.5)


@pytest.mark.parametrize("isa", ["avx2", "avx512vnni", "neon", "portable", "off"])
def test_the_estimate_repacks_exactly_where_the_named_kernels_run_x16(
    isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A named ISA with x16 kernels repacks where this CPU runs it (NEON only on aarch64); portable C and
    the pure-torch path never do."""
    from localchat.backends.torch.cpu import kernels

    monkeypatch.delenv("LOCALCHAT_KERNEL_LAYOUT", raising=False)
    monkeypatch.setenv("LOCALCHAT_KERNELS", isa)
    assert x16_active() == (isa in ("avx2", "avx512vnni", "neon") and isa in kernels.runnable_isas())
