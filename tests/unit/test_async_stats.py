"""The async engine's stats snapshot: rebuilt when a request ends or a command came in, else at most
every STATS_REFRESH_S, never once per decode step."""

from __future__ import annotations

import threading

from localchat.engine import async_engine as ae
from localchat.engine.async_engine import AsyncEngine
from localchat.engine.engine import LLMEngine
from localchat.engine.outputs import EngineStats, RequestOutput
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import chat_prompt, fake_engine


def test_stats_follow_requests_without_a_rebuild_per_step() -> None:
    engine = fake_engine()
    calls = [0]
    real = LLMEngine.stats

    def counted() -> EngineStats:
        calls[0] += 1
        return real(engine)

    engine.stats = counted  # type: ignore[method-assign]
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:
        done = threading.Event()
        seen: list[tuple[RequestOutput, int]] = []

        def sink(out: RequestOutput) -> None:  # the engine thread: after this step's snapshot
            seen.append((out, async_engine.stats().requests_finished_total))
            if out.finished:
                done.set()

        calls[0] = 0
        # ~1 ms a token for 120 tokens: far more steps than 50 ms windows
        async_engine.submit(
            chat_prompt("<<slow:1>><<say:" + "x" * 120 + ">>"), SamplingParams(max_tokens=200), sink
        )
        assert done.wait(10)
        steps = len(seen)
        assert steps >= 60 and calls[0] < steps / 2
        # The output that ends the request already sees itself counted; none before it did.
        assert seen[-1][1] == 1 and all(n == 0 for _, n in seen[:-1])
        assert async_engine.stats().num_running == 0
    finally:
        async_engine.shutdown(drain_timeout_s=1)


def test_the_refresh_interval_is_short() -> None:
    assert 0 < ae.STATS_REFRESH_S <= 0.1  # /metrics readers see at most this stale a snapshot
