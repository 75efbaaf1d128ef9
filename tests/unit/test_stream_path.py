"""The streaming path's per-token work. `Generation.batches`, the HTTP side's reader of a call's outputs (one wait a batch, no task per wait):
every output arrives once and in order, outputs ready together come as one batch, a silent stretch
yields the keep-alive's empty batch and the stream goes on after it, leaving early aborts. The reasoning
splitter's held-back tail (`_partial_tag_len`) equals its plain definition on every short text, its
deltas equal the tag-scanning loop's for any cut of a text (the no-"<" shortcut included), and a
chunk built by `ListEvents` is byte for byte `event(head | {"choices": [choice]} | tail)`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
from collections.abc import Iterator

import pytest

from localchat.engine.async_engine import AsyncEngine
from localchat.engine.outputs import RequestOutput
from localchat.engine.sampling_params import SamplingParams
from localchat.server.sse import ListEvents, event
from localchat.serving.generation import Generation
from localchat.serving.reasoning import CLOSE_TAG, OPEN_TAG, ReasoningSplitter, _partial_tag_len
from tests.helpers.fake_engine import chat_prompt, fake_engine
from tests.helpers.run_async import run_async


@pytest.fixture
def engine() -> Iterator[AsyncEngine]:
    eng = AsyncEngine(fake_engine())
    eng.start()
    yield eng
    eng.shutdown(drain_timeout_s=1)


def test_two_choices_stream_every_token_once_in_order(engine: AsyncEngine) -> None:
    async def main() -> tuple[list[str], list[set[int]]]:
        jobs = [(chat_prompt(f"<<say:choice number {i}>>"), SamplingParams(max_tokens=50)) for i in range(2)]
        gen = Generation(engine, "call", jobs)
        texts = ["", ""]
        groups = []
        async for batch in gen.batches(keepalive_s=30):
            groups.append({index for index, _ in batch})
            for index, out in batch:
                texts[index] += out.text_delta
        assert gen.finished
        return texts, groups

    texts, groups = run_async(main())
    assert texts == ["choice number 0", "choice number 1"]
    assert {0, 1} in groups  # both choices' outputs of one step come together


def test_silence_yields_keepalives_and_the_stream_goes_on(engine: AsyncEngine) -> None:
    async def main() -> tuple[str, int]:
        gen = Generation(
            engine, "call", [(chat_prompt("<<slow:60>><<say:abc>>"), SamplingParams(max_tokens=9))]
        )
        text, keepalives = "", 0
        async for batch in gen.batches(keepalive_s=0.01):
            keepalives += not batch
            text += "".join(out.text_delta for _, out in batch)
        return text, keepalives

    text, keepalives = run_async(main())
    assert text == "abc" and keepalives >= 2


def test_a_shorter_keepalive_than_a_cancelled_wait_fires_on_time(engine: AsyncEngine) -> None:
    async def main() -> list[tuple[int, RequestOutput]]:
        prompt = chat_prompt("<<slow:1000>><<say:ab>>")  # the first output comes a second later
        gen = Generation(engine, "call", [(prompt, SamplingParams(max_tokens=5))])
        long_wait = asyncio.ensure_future(gen.batches(keepalive_s=30).__anext__())
        await asyncio.sleep(0.01)
        long_wait.cancel()  # its keep-alive timer, 30 s out, stays set
        with contextlib.suppress(asyncio.CancelledError):
            await long_wait
        batch = await gen.batches(keepalive_s=0.01).__anext__()
        gen.close()
        return batch

    assert run_async(main()) == []  # the keep-alive after 0.01 s, not the first output


def test_leaving_early_aborts_the_request(engine: AsyncEngine) -> None:
    async def main() -> None:
        prompt = chat_prompt("<<slow:5>><<say:" + "w" * 300 + ">>")
        gen = Generation(engine, "call", [(prompt, SamplingParams(max_tokens=400))])
        async for batch in gen.batches(keepalive_s=30):
            if any(out.num_output_tokens >= 3 for _, out in batch):
                break
        gen.close()

    run_async(main())
    for _ in range(300):
        if engine.num_in_flight == 0:
            break
        threading.Event().wait(0.01)
    assert engine.num_in_flight == 0 and engine.engine.block_manager.num_used_blocks == 0


def test_cancelled_reader_leaves_no_waiter(engine: AsyncEngine) -> None:
    async def main() -> None:
        gen = Generation(
            engine, "call", [(chat_prompt("<<slow:200>><<say:ab>>"), SamplingParams(max_tokens=5))]
        )
        reader = asyncio.ensure_future(gen.batches(keepalive_s=30).__anext__())
        await asyncio.sleep(0.02)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert gen._waiter is None
        gen.close()

    run_async(main())


def _plain_partial(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def test_partial_tag_len_equals_its_definition() -> None:
    texts = ["".join(t) for n in range(7) for t in itertools.product("<t/h>x", repeat=n)]
    rng = random.Random(0)
    texts += ["".join(rng.choice("<think/>ab") for _ in range(rng.randint(7, 20))) for _ in range(3000)]
    for text in texts:
        for tag in (OPEN_TAG, CLOSE_TAG):
            assert _partial_tag_len(text, tag) == _plain_partial(text, tag), (text, tag)


@pytest.mark.parametrize("tail", [{}, {"usage": None}])
def test_list_events_are_the_merged_event(tail: dict[str, object]) -> None:
    head = {"id": "chatcmpl-[null]", "object": "chat.completion.chunk", "created": 17, "model": "m ü",
            "system_fingerprint": None}  # fmt: skip
    events = ListEvents(head, "choices", tail)
    choices = [
        {"index": 0, "delta": {"content": "héllo \"[null]\"\n"}, "logprobs": None, "finish_reason": None},
        {"index": 3, "delta": {}, "logprobs": {"content": [{"token": "a", "logprob": -0.5}]}, "finish_reason": "stop"},
        {"index": 1, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "logprobs": None,
         "finish_reason": None, "stop_reason": "loop"},
    ]  # fmt: skip
    for choice in choices:
        assert events(choice) == event(head | {"choices": [choice]} | tail)


def _loop_push(splitter: ReasoningSplitter, text: str) -> tuple[str, str]:
    """ReasoningSplitter.push without its shortcut: the tag-scanning loop alone."""
    buf, splitter._held = splitter._held + text, ""
    reasoning: list[str] = []
    content: list[str] = []
    while buf:
        tag = CLOSE_TAG if splitter.in_reasoning else OPEN_TAG
        at = buf.find(tag)
        if at < 0:
            keep = _plain_partial(buf, tag)
            splitter._emit(buf[: len(buf) - keep], reasoning, content)
            splitter._held = buf[len(buf) - keep :]
            break
        splitter._emit(buf[:at], reasoning, content)
        buf = buf[at + len(tag) :]
        splitter.in_reasoning = not splitter.in_reasoning
        splitter._strip_content = not splitter.in_reasoning
    return "".join(reasoning), "".join(content)


def test_reasoning_deltas_equal_the_scanning_loop() -> None:
    rng = random.Random(1)
    pieces = ["<think>", "</think>", "<", "</", "<thi", "a", " ", "\n", "b c", "<b>", "x<", "nk>"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        for start in (False, True):
            fast, plain = ReasoningSplitter(start), ReasoningSplitter(start)
            for delta in deltas:
                assert fast.push(delta) == _loop_push(plain, delta), (text, deltas)
                assert (fast.in_reasoning, fast._held, fast._strip_content) == (
                    plain.in_reasoning, plain._held, plain._strip_content,
                )  # fmt: skip
            assert fast.flush() == plain.flush()
