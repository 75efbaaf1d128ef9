"""The engine thread: async streaming, abort on early exit, queue limit, errors, shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest

from localchat.engine.async_engine import AsyncEngine
from localchat.engine.outputs import RequestOutput
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import ContextLengthExceededError, EngineDeadError, QueueFullError
from tests.helpers.fake_engine import chat_prompt, fake_engine, no_error
from tests.helpers.run_async import run_async


@pytest.fixture
def engine() -> AsyncEngine:
    eng = AsyncEngine(fake_engine())
    eng.start()
    yield eng
    eng.shutdown(drain_timeout_s=1)


def test_concurrent_async_streams_each_get_their_own_reply(engine: AsyncEngine) -> None:
    async def one(i: int) -> str:
        text = ""
        async for out in engine.generate(chat_prompt(f"<<say:answer {i}>>"), SamplingParams(max_tokens=50)):
            text += no_error(out).text_delta
        return text

    async def main() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(10)))

    assert run_async(main()) == [f"answer {i}" for i in range(10)]
    assert engine.engine.block_manager.num_used_blocks == 0


def test_leaving_the_stream_early_aborts_and_frees_blocks(engine: AsyncEngine) -> None:
    async def main() -> None:
        params = SamplingParams(max_tokens=500)
        async for out in engine.generate(chat_prompt("<<slow:5>><<say:" + "w" * 400 + ">>"), params):
            if no_error(out).num_output_tokens >= 5:
                break

    run_async(main())
    for _ in range(200):
        if engine.num_in_flight == 0:
            break
        threading.Event().wait(0.01)
    assert engine.num_in_flight == 0
    assert engine.engine.block_manager.num_used_blocks == 0


def test_queue_full_is_a_typed_error() -> None:
    eng = AsyncEngine(fake_engine(max_num_seqs=1, max_queue_len=1))
    eng.start()
    try:
        done = threading.Event()
        sink = lambda out: done.set() if out.finished else None  # noqa: E731
        slow = chat_prompt("<<slow:20>><<say:" + "q" * 50 + ">>")
        eng.submit(slow, SamplingParams(max_tokens=50), sink)
        eng.submit(slow, SamplingParams(max_tokens=50), sink)
        with pytest.raises(QueueFullError):
            eng.submit(slow, SamplingParams(max_tokens=50), sink)
    finally:
        eng.shutdown(drain_timeout_s=0)


def test_context_errors_are_raised_to_the_caller(engine: AsyncEngine) -> None:
    with pytest.raises(ContextLengthExceededError):
        engine.submit(list(range(3, 5000)), SamplingParams(), lambda out: None)


def test_shutdown_drains_in_flight_requests_then_refuses_new_ones() -> None:
    eng = AsyncEngine(fake_engine())
    eng.start()
    outs: list[RequestOutput] = []
    eng.submit(chat_prompt("<<slow:2>><<say:finish me>>"), SamplingParams(max_tokens=50), outs.append)
    eng.shutdown(drain_timeout_s=5)
    assert outs[-1].finished and outs[-1].finish_reason == FinishReason.STOP
    assert "".join(o.text_delta for o in outs) == "finish me"
    with pytest.raises(EngineDeadError):
        eng.submit(chat_prompt("hi"), SamplingParams(), outs.append)


def test_shutdown_timeout_aborts_what_is_left() -> None:
    eng = AsyncEngine(fake_engine())
    eng.start()
    outs: list[RequestOutput] = []
    eng.submit(
        chat_prompt("<<slow:50>><<say:" + "n" * 200 + ">>"), SamplingParams(max_tokens=300), outs.append
    )
    eng.shutdown(drain_timeout_s=0.2)
    assert outs[-1].finished and outs[-1].finish_reason == FinishReason.ABORT


def test_engine_gives_the_heap_back_once_each_time_it_goes_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The soak found native memory creeping up under a long varied load; trimming when idle fixes it,
    # and trimming on every step would cost latency: exactly one trim per busy -> idle transition.
    import localchat.engine.async_engine as async_engine

    trims: list[float] = []
    monkeypatch.setattr(async_engine, "trim_heap", lambda: trims.append(0.0))
    eng = AsyncEngine(fake_engine())
    eng.start()
    try:

        async def burst() -> None:
            async def one(i: int) -> None:
                async for out in eng.generate(
                    chat_prompt(f"<<say:reply {i}>>"), SamplingParams(max_tokens=20)
                ):
                    no_error(out)

            await asyncio.gather(*(one(i) for i in range(3)))

        for expected in (1, 2):
            run_async(burst())
            for _ in range(200):
                if len(trims) >= expected:
                    break
                threading.Event().wait(0.01)
            threading.Event().wait(0.1)  # an idle engine blocks on its inbox: no further trims
            assert len(trims) == expected
    finally:
        eng.shutdown(drain_timeout_s=1)
