"""A large matrix repacked from the mapped file gives its file pages back as it goes (peak RSS at load),
without changing a single packed byte, and an anonymous copy is never released (that would zero it)."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.backends.torch.cpu import kernels
from localchat.weights.page_release import file_backed, release_rows
from tests.backends.test_kernels_matmul import weights

X16_ISAS = [isa for isa in ("avx2", "avx512vnni", "neon") if isa in kernels.runnable_isas()]
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads RssFile from /proc/self/status")


def rss_file_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile line")


@linux_only
def test_released_rows_leave_the_resident_set_and_still_read_back(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    values = np.random.default_rng(0).integers(0, 256, size=(2048, 16384), dtype=np.uint8)  # 32 MiB
    values.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=values.shape)
    assert file_backed(mapped) and file_backed(mapped.reshape(-1, 8192)[10:])
    assert int(mapped.sum(dtype=np.int64)) == int(values.sum(dtype=np.int64))  # every page resident
    before = rss_file_kib()
    release_rows(mapped, 0, 2048)
    dropped = before - rss_file_kib()
    assert dropped > 30 * 1024, f"only {dropped} KiB left the resident set"
    assert np.array_equal(mapped[1000:1010], values[1000:1010])  # faulted back in from the page cache


def test_an_anonymous_copy_is_never_released() -> None:
    values = np.arange(4 * mmap.PAGESIZE * 64, dtype=np.uint8).reshape(64, -1)
    copy = values.copy()
    assert not file_backed(copy)
    release_rows(copy, 0, 64)
    assert np.array_equal(copy, values)


@pytest.mark.skipif(not X16_ISAS, reason="no x16 kernels on this CPU")
@pytest.mark.parametrize("qtype", ["Q4_0", "Q6_K"])
def test_packing_in_runs_gives_the_same_panels_and_reports_every_row(
    qtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = weights(qtype, 77, 512, seed=3)  # four full panels and a partial one
    ops = kernels.load(X16_ISAS[-1])
    assert ops is not None
    whole = ops.pack_rows(qtype, raw.ctypes.data, 77, raw.shape[1], 512)
    monkeypatch.setattr(kernels, "PACK_CHUNK_ROWS", 32)
    runs: list[tuple[int, int]] = []
    chunked = ops.pack_rows(qtype, raw.ctypes.data, 77, raw.shape[1], 512, lambda a, b: runs.append((a, b)))
    assert runs == [(0, 32), (32, 64), (64, 77)]
    assert chunked.rows == whole.rows == 77
    assert torch.equal(chunked.data, whole.data)
