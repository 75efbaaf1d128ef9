"""Buffers for the x16 panels in transparent huge pages (Linux), so that decode's stream of weights does
not walk the page tables every 4 KiB.

A single-stream decode reads every weight once a token (~1 GB for a 1.5B Q4_K_M model), from memory the
TLB cannot cover in 4 KiB pages: each page is a table walk, and the hardware prefetchers stop at page
ends. The box's transparent huge pages are `madvise` (the common default), so torch's allocations got
none. A two-thread read probe here: 42-44 GB/s over 4 KiB pages, 47-48 over 2 MiB ones (docs/performance.md,
issue #34). Only whole 2 MiB pages inside a buffer are advised: a huge page is resident as a whole, so
advising a buffer's tail would add up to 2 MiB of RSS per matrix; tails stay in 4 KiB pages.
"""

from __future__ import annotations

import contextlib
import mmap
import sys

import torch

__all__ = ["HUGE_PAGE", "empty"]

HUGE_PAGE = 2 << 20  # x86-64's and most aarch64 kernels' transparent huge page


def empty(nbytes: int) -> torch.Tensor:
    """An uninitialized uint8 [nbytes] whose whole 2 MiB pages are advised as huge pages: fresh anonymous
    memory (a recycled heap chunk's pages would already be faulted in small, and advice does not change
    present pages), starting on a 2 MiB boundary (the mapping is 2 MiB longer; its unused start is never
    touched, so not resident). Below one huge page, or where madvise is missing, a plain torch.empty.
    Advice that fails is ignored: the buffer then simply stays in small pages. The tensor keeps the
    mapping alive; it is unmapped with the tensor's last view."""
    if nbytes < HUGE_PAGE or not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(nbytes, dtype=torch.uint8)
    try:
        # private: an anonymous shared mapping is shmem, whose huge pages are another (usually off) setting
        mapped = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return torch.empty(nbytes, dtype=torch.uint8)
    whole = torch.frombuffer(mapped, dtype=torch.uint8)  # holds `mapped`'s buffer: the mapping stays
    start = -whole.data_ptr() % HUGE_PAGE
    with contextlib.suppress(OSError):
        mapped.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return whole[start : start + nbytes]
