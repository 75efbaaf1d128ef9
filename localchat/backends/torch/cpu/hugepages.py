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

import ctypes
import mmap
import sys
from collections.abc import Callable
from functools import cache

import torch

__all__ = ["HUGE_PAGE", "empty"]

HUGE_PAGE = 2 << 20  # x86-64's and most aarch64 kernels' transparent huge page


@cache
def _madvise() -> Callable[..., int] | None:
    """libc's madvise where huge pages can be asked for (Linux), else None."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def empty(nbytes: int) -> torch.Tensor:
    """An uninitialized uint8 [nbytes] whose whole 2 MiB pages are advised as huge pages: it starts on a
    2 MiB boundary (the allocation is 2 MiB longer; the unused start is never touched, so not resident).
    Below one huge page, or where madvise is missing, a plain torch.empty. Advice that fails is ignored:
    the buffer then simply stays in small pages."""
    madvise = _madvise()
    if nbytes < HUGE_PAGE or madvise is None:
        return torch.empty(nbytes, dtype=torch.uint8)
    base = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    start = -base.data_ptr() % HUGE_PAGE
    out = base[start : start + nbytes]  # keeps `base` alive
    madvise(
        ctypes.c_void_p(out.data_ptr()), ctypes.c_size_t(nbytes // HUGE_PAGE * HUGE_PAGE), mmap.MADV_HUGEPAGE
    )
    return out
