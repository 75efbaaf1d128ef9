"""A step's outputs handed to their callers just before the next step's model compute starts, not
right after the step (async_engine.py defers, the runner flushes).

NOTE: why. Handing outputs to an asyncio loop writes to the loop's wake-up socket; the HTTP thread wakes
and takes the GIL for its ~0.3 ms of streaming work (SSE encoding, the socket write), while the engine
thread still has the next step's Python to run (scheduler, batch, inputs: ~0.5 ms, torch and ctypes
calls that release the GIL at every op). The two ping-pong on the GIL and the engine thread waits out
the HTTP work: 0.40 ms a token on the real Qwen2.5-Coder-1.5B (docs/performance.md, #34). Woken just
before the compute, which releases the GIL for milliseconds (the fused C decode step, the LM head), the
HTTP thread runs beside the model instead.

Per thread: each engine thread defers its own step's outputs; `flush` on a thread with nothing pending
costs one attribute read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_local = threading.local()


def defer(deliver: Callable[[], None]) -> None:
    """Run `deliver` at this thread's next `flush`, after anything deferred before it."""
    pending: list[Callable[[], None]] | None = getattr(_local, "pending", None)
    if pending is None:
        _local.pending = [deliver]
    else:
        pending.append(deliver)


def flush() -> None:
    """Run what this thread deferred, in order (each at most once, even if one raises)."""
    pending: list[Callable[[], None]] | None = getattr(_local, "pending", None)
    if not pending:
        return
    _local.pending = None
    for i, deliver in enumerate(pending):
        try:
            deliver()
        except BaseException:
            if i + 1 < len(pending):  # the rest still run at the next flush, in order
                rest = pending[i + 1 :]
                _local.pending = rest + (getattr(_local, "pending", None) or [])
            raise


def pending() -> bool:
    """Whether this thread has deferred deliveries waiting."""
    return bool(getattr(_local, "pending", None))
