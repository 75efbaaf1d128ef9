"""Host memory facts shared by the backends (no torch, no mlx here)."""

from __future__ import annotations

import contextlib
import os


def mem_available() -> int | None:
    """Bytes of RAM the OS can hand out without swapping (Linux MemAvailable, else free pages)."""
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None
