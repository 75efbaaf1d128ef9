"""The batching encoder engine without torch: a fake batch function records every pass. The engine is
built outside any loop and used from fresh loops (run_async), as the server and tests do."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from localchat.embeddings.engine import BatchingEncoder
from localchat.embeddings.text import Encoded
from localchat.errors import QueueFullError
from tests.helpers.deadline import async_wait_until
from tests.helpers.run_async import run_async


def _item(n: int, tag: int = 0) -> Encoded:
    return Encoded([tag] * n, [0] * n)


class Recorder:
    """Answers [first id, length] per input; remembers each pass's lengths; can fail or block."""

    def __init__(self, fail_tag: int | None = None) -> None:
        self.passes: list[list[int]] = []
        self.fail_tag = fail_tag
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0  # passes the worker has taken, counted before the gate

    def __call__(self, batch: list[Encoded]) -> np.ndarray:
        self.calls += 1
        self.gate.wait(5)
        self.passes.append([len(e) for e in batch])
        if self.fail_tag is not None and any(e.ids[0] == self.fail_tag for e in batch):
            raise RuntimeError("boom")
        return np.array([[e.ids[0], len(e)] for e in batch], dtype=np.float32)


def test_concurrent_requests_share_one_pass_sorted_longest_first() -> None:
    rec = Recorder()
    engine = BatchingEncoder(rec, max_batch_tokens=1000)

    async def main() -> list[list[np.ndarray]]:
        rec.gate.clear()  # hold the first pass so the others queue up behind it
        first = asyncio.ensure_future(engine.submit([_item(1, 9)]))
        await async_wait_until(lambda: rec.calls == 1, 5, "the first pass is taken")
        rest = [asyncio.ensure_future(engine.submit([_item(n, n) for n in (3, 7, 5)])) for _ in range(3)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        out = await asyncio.gather(first, *rest)
        await engine.aclose()
        return out

    out = run_async(main())
    assert [r.tolist() for r in out[1]] == [[3, 3], [7, 7], [5, 5]]  # each caller gets its rows, in order
    assert rec.passes == [[1], [7, 7, 7, 5, 5, 5, 3, 3, 3]]  # 9 inputs of 3 requests: one pass


def test_padded_token_budget_splits_passes() -> None:
    rec = Recorder()
    engine = BatchingEncoder(rec, max_batch_tokens=20)

    async def main() -> None:
        await engine.submit([_item(n) for n in (10, 2, 10, 2, 2, 2, 2)])
        await engine.aclose()

    run_async(main())
    # longest first: two 10s fill the budget (2 x 10); the short ones go together
    assert rec.passes == [[10, 10], [2, 2, 2, 2, 2]]
    assert all(max(p) * len(p) <= 20 for p in rec.passes)


def test_a_failing_pass_fails_only_its_own_requests() -> None:
    rec = Recorder(fail_tag=66)
    engine = BatchingEncoder(rec, max_batch_tokens=8)

    async def main() -> tuple[Any, list[np.ndarray]]:
        bad = asyncio.ensure_future(engine.submit([_item(8, 66)]))  # fills a pass on its own
        good = asyncio.ensure_future(engine.submit([_item(2, 1)]))
        results = await asyncio.gather(bad, good, return_exceptions=True)
        again = await engine.submit([_item(3, 2)])  # the worker survived the failure
        await engine.aclose()
        return results, again

    (bad, good), again = run_async(main())
    assert isinstance(bad, RuntimeError)
    assert isinstance(good, list) and good[0].tolist() == [1, 2]
    assert again[0].tolist() == [2, 3]


def test_full_queue_is_refused_with_503() -> None:
    rec = Recorder()
    engine = BatchingEncoder(rec, max_queue=4)

    async def main() -> None:
        rec.gate.clear()
        running = asyncio.ensure_future(engine.submit([_item(2)]))
        await async_wait_until(lambda: rec.calls == 1, 5, "taken by the worker: the queue is empty again")
        waiting = asyncio.ensure_future(engine.submit([_item(2)] * 3))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError) as info:
            await engine.submit([_item(2)] * 2)
        assert info.value.status == 503
        rec.gate.set()
        await asyncio.gather(running, waiting)
        await engine.aclose()

    run_async(main())


def test_engine_built_outside_a_loop_works_from_successive_loops() -> None:
    engine = BatchingEncoder(Recorder())  # no loop is running here
    for n in (2, 4):  # each run_async is a new loop: the worker restarts in it
        rows = run_async(engine.submit([_item(n, n)]))
        assert rows[0].tolist() == [n, n]
    run_async(engine.aclose())


def test_cancelled_request_is_skipped() -> None:
    rec = Recorder()
    engine = BatchingEncoder(rec)

    async def main() -> None:
        rec.gate.clear()
        first = asyncio.ensure_future(engine.submit([_item(1)]))
        await async_wait_until(lambda: rec.calls == 1, 5, "the first pass is taken")
        gone = asyncio.ensure_future(engine.submit([_item(5)]))
        await asyncio.sleep(0.01)
        gone.cancel()
        rec.gate.set()
        await first
        assert (await engine.submit([_item(3)]))[0].tolist() == [0, 3]
        await engine.aclose()

    run_async(main())
    assert [5] not in rec.passes
