"""The x16 panels live in transparent huge pages on Linux (decode streams them once a token): a packed or
merged matrix of whole 2 MiB pages starts on a 2 MiB boundary and the kernel backs it with huge pages,
its values unchanged; small buffers and tails stay plain."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.backends.torch.cpu import hugepages, kernels
from tests.backends.test_kernels_matmul import weights

X16_ISAS = [isa for isa in ("avx2", "avx512vnni", "neon") if isa in kernels.runnable_isas()]
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
thp_on = pytest.mark.skipif(
    sys.platform != "linux" or not THP.exists() or "[never]" in THP.read_text(),
    reason="Linux with transparent huge pages (always or madvise)",
)


def huge_kib(address: int, nbytes: int) -> int:
    """AnonHugePages of the mappings overlapping [address, address + nbytes) (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo < address + nbytes and hi > address
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def test_small_buffers_are_plain_and_large_ones_start_on_a_huge_page() -> None:
    small = hugepages.empty(4096)
    assert small.numel() == 4096 and small.dtype == torch.uint8
    large = hugepages.empty(3 * hugepages.HUGE_PAGE + 12345)
    assert large.numel() == 3 * hugepages.HUGE_PAGE + 12345
    if sys.platform.startswith("linux"):
        assert large.data_ptr() % hugepages.HUGE_PAGE == 0


@thp_on
def test_a_written_buffer_is_backed_by_huge_pages() -> None:
    buf = hugepages.empty(8 * hugepages.HUGE_PAGE)
    buf.fill_(1)
    # the kernel may lack free huge pages at the moment; most of 16 MiB still comes back huge
    assert huge_kib(buf.data_ptr(), buf.numel()) >= 8 * 1024, "no huge pages behind a 16 MiB buffer"


@pytest.mark.parametrize("isa", X16_ISAS)
def test_packed_and_merged_matrices_are_huge_page_aligned_and_unchanged(isa: str) -> None:
    ops = kernels.load(isa)
    assert ops is not None
    cols = 2048
    raw = np.ascontiguousarray(weights("Q4_K", 2048, cols, seed=3))  # 2048 x 2048 Q4_K: 2.4 MB of panels
    packed = ops.pack_rows("Q4_K", raw.ctypes.data, 2048, raw.shape[1], cols)
    assert packed.data.data_ptr() % hugepages.HUGE_PAGE == 0 or not sys.platform.startswith("linux")
    half = ops.pack_rows("Q4_K", raw.ctypes.data, 1024, raw.shape[1], cols)
    rest = ops.pack_rows("Q4_K", raw[1024:].ctypes.data, 1024, raw.shape[1], cols)
    parts = [kernels.BlockMatrix([s], cols, ops) for s in (half, rest)]
    (merged,) = kernels.merge_segments(parts)
    assert merged.rows == 2048 and torch.equal(merged.data, packed.data)
    assert merged.data.data_ptr() % hugepages.HUGE_PAGE == 0 or not sys.platform.startswith("linux")
