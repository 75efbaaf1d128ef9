"""Host memory facts shared by the engine, the backends and the model manager (no torch, no mlx)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys


def mem_available() -> int | None:
    """Bytes of RAM the OS can hand out without swapping (Linux MemAvailable, else free pages)."""
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def trim_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc only; elsewhere a no-op).

    NOTE: loading a model frees hundreds of MiB of temporaries that glibc keeps in its arenas; on the
    dev box (SmolLM2-135M GGUF, torch) trimming after load took 64 MiB off the resident size.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError, TypeError):
        name = ctypes.util.find_library("c")
        if name:
            ctypes.CDLL(name).malloc_trim(0)
