"""Dropping a memory-mapped weight file's pages from the resident set while a loader still works on it.

A loader that repacks a large tensor straight from the mapped file (the x16 layout) holds the tensor's
file pages and its packed copy at once until the tensor is done: for an 8B model's 152k-row Q6_K output
matrix that was ~490 MiB of peak RSS above what the model keeps. Releasing each consumed run of rows
as it goes takes that back. Only file-backed memory is released: the page cache keeps the bytes and a
later read faults them back in, whereas releasing an anonymous copy would zero it.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable
from functools import cache

import numpy as np

__all__ = ["file_backed", "release_rows"]


def file_backed(array: np.ndarray) -> bool:
    """Whether `array` views a memory-mapped file (numpy's memmap, or an mmap object under its bases)."""
    base: object | None = array
    while base is not None:
        if isinstance(base, (mmap.mmap, np.memmap)):
            return True
        base = getattr(base, "base", None)
    return False


@cache
def _madvise() -> Callable[..., int] | None:
    if sys.platform == "win32" or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def release_rows(array: np.ndarray, start: int, end: int) -> None:
    """Take rows [start, end) of a C-contiguous 2-D `array` out of this process's resident set, when
    `array` is file-backed (else nothing happens). Only whole pages inside the rows are released, so
    neighbouring rows (and tensors) are untouched; failures are ignored (it is only a memory hint)."""
    madvise = _madvise()
    if madvise is None or array.ndim != 2 or not array.flags.c_contiguous or not file_backed(array):
        return
    row_bytes = array.shape[1] * array.itemsize
    first = array.ctypes.data + start * row_bytes
    last = array.ctypes.data + end * row_bytes
    page = mmap.PAGESIZE
    lo, hi = -(-first // page) * page, last // page * page
    if hi > lo:
        madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED)
