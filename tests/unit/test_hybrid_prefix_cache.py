"""Prefix caching for hybrid models: cached K/V blocks reused only with a state checkpoint at their end
(engine/state_checkpoints.py, engine/hybrid_prefix.py), on the fake backend in its hybrid mode.

The fake runner keeps, per state slot, the tokens its sequence has fed, and raises (an error finish) when
a row continues from a state that is not exactly its context's first tokens: a skipped restore, a
checkpoint taken at the wrong time or overwritten while in use, or a slot reused too early all fail.
"""

from __future__ import annotations

from collections import deque
from typing import Any, cast

import pytest

from localchat.backends.fake import EOS_ID, FakeRunner, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.state_checkpoints import StateCheckpoints
from tests.helpers.fake_engine import chat_prompt, drain

STATE_BYTES = 1024
BLOCK = 16


def hybrid_engine(kv_bytes_per_token: int = 128, **config: object) -> LLMEngine:
    """`kv_bytes_per_token`: larger shrinks the 1 MiB pool's blocks (preemption, eviction)."""
    cfg = EngineConfig(**{"kv_cache_mib": 1, "block_size": BLOCK, **config})  # type: ignore[arg-type]
    runner = FakeRunner(kv_bytes_per_token=kv_bytes_per_token, state_bytes=STATE_BYTES)
    return LLMEngine(runner, FakeTokenizer(), cfg, eos_token_ids=[EOS_ID], model_max_len=4096)


def run(engine: LLMEngine, prompt: list[int], max_tokens: int = 256) -> tuple[list[int], int]:
    """(output tokens, cached prompt tokens) of one request run alone."""
    req_id = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    tokens: list[int] = []
    cached = -1
    for out in drain(engine):  # raises on an error finish (the fake's state check among them)
        assert out.req_id == req_id
        tokens += out.new_token_ids
        cached = out.num_cached_tokens
    return tokens, cached


def test_prefix_caching_is_on_with_checkpoints_and_reported() -> None:
    engine = hybrid_engine()
    stats = engine.stats()
    assert engine.block_manager.enable_prefix_caching and not engine.prefix_caching_note
    assert stats.prefix_caching_enabled
    assert stats.state_checkpoints_total == 8 and stats.state_checkpoints_used == 0
    assert engine.state_pool is not None
    assert len(engine.runner.states) == engine.state_pool.num_slots + 8  # type: ignore[attr-defined]


def test_next_turn_reuses_the_conversation_up_to_the_last_block_boundary() -> None:
    engine = hybrid_engine()
    first = chat_prompt("<<say:" + "a long answer that spans a few blocks of tokens " * 2 + ">>")
    reply, cached = run(engine, first)
    assert cached == 0 and reply[-1] == EOS_ID
    # The next prompt: this one, the reply (its last token, EOS, was sampled but never fed) and more.
    second = first + reply + FakeTokenizer().encode("\n<|im_start|>user\nand now?<|im_end|>\n")
    processed = len(first) + len(reply) - 1
    warm, cached = run(engine, second)
    assert cached == processed // BLOCK * BLOCK > len(first)
    cold, cold_cached = run(hybrid_engine(), second)
    assert cold_cached == 0 and warm == cold
    stats = engine.stats()
    assert stats.state_checkpoint_restores_total == 1 and stats.state_checkpoints_used >= 2


def test_regenerate_restores_the_prompt_checkpoint() -> None:
    engine = hybrid_engine()
    prompt = chat_prompt("<<say:short>> " + "x" * 50)
    first, _ = run(engine, prompt)
    again, cached = run(engine, prompt)
    assert again == first
    assert cached == (len(prompt) - 1) // BLOCK * BLOCK > 0
    # An edited last message shares the prompt only partly: the longest checkpointed boundary before it.
    edited = prompt[: len(prompt) - 20] + FakeTokenizer().encode("y" * 30)
    _, cached = run(engine, edited)
    assert cached == 0 or cached % BLOCK == 0
    assert cached <= len(prompt) - 20


def test_without_a_checkpoint_nothing_is_reused() -> None:
    """Cached blocks without a state at their end are computed again (never K/V without the state)."""
    engine = hybrid_engine(state_checkpoints=1)
    a = chat_prompt("<<say:ok>> " + "a" * 60)
    b = chat_prompt("<<say:ok>> " + "b" * 60)
    run(engine, a)
    run(engine, b)  # b's prompt checkpoint takes the only row: a's K/V blocks stay, its state is gone
    assert engine.block_manager.get_computed_blocks(engine.scheduler.requests.get("x") or _req(a))
    _, cached = run(engine, a)
    assert cached == 0


def _req(prompt: list[int]):
    from localchat.engine.request import Request

    return Request("probe", prompt, SamplingParams())


def test_evicted_blocks_make_the_checkpoint_useless() -> None:
    # 1 MiB at 4 KiB per token: ~15 blocks, so a few other prompts evict the first one's blocks.
    engine = hybrid_engine(kv_bytes_per_token=4096)
    prompt = chat_prompt("<<say:ok>> " + "p" * 80)
    first, _ = run(engine, prompt)
    for i in range(6):
        run(engine, chat_prompt(f"<<say:ok>> {i} " + "q" * 100))
    hits = engine.block_manager.get_computed_blocks(_req(prompt))  # (the shared chat header may stay)
    assert len(hits) * BLOCK < (len(prompt) - 1) // BLOCK * BLOCK  # the checkpointed block is gone
    again, cached = run(engine, prompt)
    assert cached == 0 and again == first


def test_skipping_the_restore_is_caught() -> None:
    """The check these tests rest on: reusing K/V without restoring the state fails the request."""
    engine = hybrid_engine()
    prompt = chat_prompt("<<say:ok>> " + "z" * 60)
    run(engine, prompt)
    checkpoints = engine.scheduler.checkpoints
    assert checkpoints is not None
    checkpoints.restore = lambda block_hash, slot: None  # type: ignore[method-assign]
    engine.add_request(prompt, SamplingParams(max_tokens=8))
    outs = [o for _ in range(4) for o in engine.step()]
    assert any(o.finish_reason == FinishReason.ERROR for o in outs)


@pytest.mark.parametrize("chunk", [0, 7, 64])
def test_many_requests_with_preemption_match_running_alone(chunk: int) -> None:
    """Requests that share prefixes (turns of three chats, regenerations) under a pool small enough to
    preempt: every output equals a cold run, and prefixes were restored."""
    engine = hybrid_engine(
        kv_bytes_per_token=2048, max_num_seqs=4, prefill_chunk_size=chunk, state_checkpoints=4
    )
    chats = [
        chat_prompt(f"<<say:reply {i} " + "r" * (20 + 9 * i) + ">> " + "c" * (30 + 7 * i)) for i in range(3)
    ]
    params = SamplingParams(max_tokens=80, temperature=0.0)
    got: dict[str, list[int]] = {}
    prompts: dict[str, list[int]] = {}
    for turn in range(3):
        for i, chat in enumerate(chats):
            for again in range(2):  # a regeneration of the same turn
                req_id = f"c{i}t{turn}r{again}"
                prompts[req_id] = list(chat)
                engine.add_request(chat, params, req_id=req_id)
                got[req_id] = []
        for out in drain(engine):
            got[out.req_id] += out.new_token_ids
        for i in range(3):
            reply = got[f"c{i}t{turn}r0"]
            chats[i] = (
                chats[i] + reply + FakeTokenizer().encode(f"\n<|im_start|>user\nturn {turn}<|im_end|>\n")
            )
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats().state_checkpoint_restores_total > 0
    for req_id, prompt in prompts.items():
        cold, _ = run(hybrid_engine(), prompt, max_tokens=80)
        assert got[req_id] == cold, req_id


def test_off_without_checkpoint_rows() -> None:
    engine = hybrid_engine(state_checkpoints=0)
    assert not engine.block_manager.enable_prefix_caching
    assert "--state-checkpoints 0" in engine.prefix_caching_note
    assert not engine.stats().prefix_caching_enabled
    prompt = chat_prompt("<<say:ok>> " + "x" * 40)
    run(engine, prompt)
    assert run(engine, prompt)[1] == 0


def test_checkpoint_index_lru_owners_and_stale_rows() -> None:
    cached = {1, 2, 3, 4, 9, 10}
    index = StateCheckpoints(first_slot=4, num_slots=3, is_cached=cached.__contains__)
    index.save(1, 16, slot=0)
    index.save(2, 32, slot=1, owner="a")
    assert index.end_step() == [(0, 4), (1, 5)]
    index.save(3, 48, slot=1, owner="a")  # a's checkpoint moves forward in place
    assert index.end_step() == [(1, 5)] and 2 not in index and 3 in index
    assert index.longest([1, 2, 3], 16) == 3 and index.longest([1, 2], 16) == 1
    index.save(4, 16, slot=2, owner="b")
    index.save(5, 16, slot=3, owner="c")  # owners may not take the last row
    assert index.end_step() == [(2, 6)] and 5 not in index
    index.release("b")
    cached.discard(4)
    index.save(9, 16, slot=3)  # full: the checkpoint whose block left the cache goes, not the LRU one
    assert 4 not in index and 1 in index and 9 in index and index.end_step() == [(3, 6)]
    index.release("a")  # LRU order now 1, 9, 3
    index.restore(1, 0)  # 9, 3, 1
    index.save(10, 16, slot=2)
    assert 9 not in index and {1, 3, 10} == {h for h in (1, 3, 10) if h in index}
    copies = index.end_step()
    assert copies == [(4, 0), (2, 6)]
    index.forget_rows({row for _, row in copies})  # the step failed: its save may never have run
    assert 10 not in index and 1 in index and 3 in index


class _TwoInFlight:
    """The fake hybrid runner behind a two-step pipeline (`--pp`): steps are submitted, then finished."""

    steps_in_flight = 2

    def __init__(self) -> None:
        self.runner = FakeRunner(state_bytes=STATE_BYTES)
        self.outputs: deque[RunnerOutput] = deque()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def submit_step(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> None:
        self.outputs.append(self.runner.execute_model(scheduler_output, batch))

    def finish_step(self) -> RunnerOutput:
        return self.outputs.popleft()


def test_off_with_steps_in_flight() -> None:
    runner = cast(Any, _TwoInFlight())
    engine = LLMEngine(
        runner, FakeTokenizer(), EngineConfig(kv_cache_mib=1), eos_token_ids=[EOS_ID], model_max_len=4096
    )
    assert engine.in_flight is not None and engine.scheduler.checkpoints is None
    assert "--pp" in engine.prefix_caching_note and not engine.stats().prefix_caching_enabled
    prompt = chat_prompt("<<say:ok>> " + "x" * 40)
    assert run(engine, prompt)[1] == run(engine, prompt)[1] == 0


def test_a_request_ending_on_a_block_boundary_saves_its_state_then() -> None:
    """Processed tokens (all but the last sampled one) ending exactly on a boundary: the state is saved at
    the end (before the slot's next owner is zeroed), and the next turn reuses every processed token."""
    reply_text = "exactly"  # 7 bytes + EOS: 8 sampled tokens, 7 of them processed
    for pad in range(BLOCK):
        first = chat_prompt(f"<<say:{reply_text}>> " + "p" * (30 + pad))
        if (len(first) + len(reply_text)) % BLOCK == 0:
            break
    engine = hybrid_engine()
    reply, _ = run(engine, first)
    processed = len(first) + len(reply) - 1
    assert processed % BLOCK == 0
    # The next request takes the freed slot; the pending save reads it first, in the same step's copies.
    second = first + reply + FakeTokenizer().encode("next")
    _, cached = run(engine, second)
    assert cached == processed


def test_an_aborted_request_keeps_its_last_decode_checkpoint() -> None:
    engine = hybrid_engine()
    first = chat_prompt("<<say:" + "a long reply " * 6 + ">> " + "q" * 20)
    req_id = engine.add_request(first, SamplingParams(max_tokens=256, temperature=0.0))
    out: list[int] = []
    while len(out) < 40:
        out += [t for o in engine.step() for t in o.new_token_ids]
    engine.abort_request(req_id)
    processed = len(first) + len(out) - 1
    second = first + out + FakeTokenizer().encode("more")
    _, cached = run(engine, second)
    assert len(first) < cached <= processed and cached % BLOCK == 0


SYSTEM = (
    "<|im_start|>system\nYou are an agent. Tools: " + "{'name': 'search', 'args': ...} " * 6 + "<|im_end|>\n"
)


def agent_chat(question: str) -> list[int]:
    """A new chat of an agent client: the same long system prompt (tool schemas), then its own message."""
    return FakeTokenizer().encode(SYSTEM) + chat_prompt(f"<<say:answer to {question}>> {question}")


def shared_blocks(chats: list[list[int]]) -> int:
    """Whole blocks all of `chats` begin with."""
    same = next(i for i, column in enumerate(zip(*chats, strict=False)) if len(set(column)) > 1)
    return same // BLOCK


def prefill_steps(engine: LLMEngine, prompt: list[int]) -> tuple[int, list[int], int]:
    """(steps until the first token, output tokens, cached prompt tokens) of one request run alone."""
    req_id = engine.add_request(prompt, SamplingParams(max_tokens=256, temperature=0.0))
    steps, first, tokens, cached = 0, 0, [], -1
    while engine.has_unfinished:
        outs = engine.step()
        steps += 1
        for out in outs:
            assert out.req_id == req_id and out.finish_reason != FinishReason.ERROR
            tokens += out.new_token_ids
            cached = out.num_cached_tokens
            first = first or (steps if out.new_token_ids else 0)
    return first, tokens, cached


@pytest.mark.parametrize("chunk", [0, 7, 64])
def test_new_chats_sharing_a_long_system_prompt_reuse_it_from_the_third_on(chunk: int) -> None:
    """The first chat computes everything; the second finds the shared prefix's K/V cached but no state
    there, computes it again and saves a checkpoint where it diverges; the third restores it."""
    engine = hybrid_engine(prefill_chunk_size=chunk)
    chats = [agent_chat(q) for q in ("what is up?", "find the docs", "list the files please")]
    shared = shared_blocks(chats) * BLOCK
    assert shared >= 8 * BLOCK
    _, cached = run(engine, chats[0])
    assert cached == 0
    saves = engine.stats().state_checkpoint_saves_total
    _, cached = run(engine, chats[1])
    assert cached == 0  # no state at the shared boundary yet: all computed
    # Its prompt boundary, its decode boundaries, and the shared prefix's end (the new one).
    assert engine.stats().state_checkpoint_saves_total > saves
    third, cached = run(engine, chats[2])
    assert cached == shared
    cold, _ = run(hybrid_engine(prefill_chunk_size=chunk), chats[2])
    assert third == cold
    assert engine.stats().state_checkpoint_restores_total == 1


def test_the_shared_prefix_cut_costs_one_step_and_only_when_worth_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """One extra prefill step for the second chat (the cut at the shared boundary), none for the first or
    third; a shared run of fewer than MIN_SHARED_BLOCKS cached blocks is not cut (no checkpoint)."""
    from localchat.engine import hybrid_prefix

    engine = hybrid_engine()  # unchunked: a prompt's prefill is one step, plus its boundary cut
    chats = [agent_chat(q) for q in ("one?", "two?", "three?")]
    got = [prefill_steps(engine, chat) for chat in chats]
    # Cut at the prompt's last block boundary (all three), and the second's at the shared one; the third
    # restores there and computes the rest.
    assert [s for s, _, _ in got] == [2, 3, 2]
    assert [c for _, _, c in got] == [0, 0, shared_blocks(chats) * BLOCK]
    monkeypatch.setattr(hybrid_prefix, "MIN_SHARED_BLOCKS", shared_blocks(chats) + 1)
    engine = hybrid_engine()
    got = [prefill_steps(engine, chat) for chat in chats]
    assert [s for s, _, _ in got] == [2, 2, 2] and [c for _, _, c in got] == [0, 0, 0]


@pytest.mark.parametrize("chunk", [0, 7])
def test_agent_chats_sharing_a_prefix_under_preemption_match_running_alone(chunk: int) -> None:
    """Waves of new chats with the same system prompt, run together in a pool small enough to preempt:
    shared-prefix saves and restores happen mid-flight and every output equals a cold run."""
    engine = hybrid_engine(
        kv_bytes_per_token=2048, max_num_seqs=3, prefill_chunk_size=chunk, state_checkpoints=4
    )
    params = SamplingParams(max_tokens=40, temperature=0.0)
    prompts = {
        f"w{w}q{q}": agent_chat(f"wave {w} question {q}" + "?" * q) for w in range(3) for q in range(3)
    }
    got: dict[str, list[int]] = {r: [] for r in prompts}
    for wave in range(3):
        for req_id, prompt in prompts.items():
            if req_id.startswith(f"w{wave}"):
                engine.add_request(prompt, params, req_id=req_id)
        for out in drain(engine):
            got[out.req_id] += out.new_token_ids
    stats = engine.stats()
    assert engine.scheduler.num_preemptions > 0 and stats.state_checkpoint_restores_total > 0
    for req_id, prompt in prompts.items():
        assert got[req_id] == run(hybrid_engine(), prompt, max_tokens=40)[0], req_id


def tooled_chat(tools: str, question: str) -> list[int]:
    """An agent client's new chat: the same system prompt, one of its tool sets, then its own message."""
    schemas = "".join(f"{{'name': '{tools}{i}', 'args': '...'}} " for i in range(4))
    return agent_chat(f"{schemas}\n{question}")


@pytest.mark.parametrize("chunk", [64, 48])
def test_nested_shared_prefixes_are_cut_where_the_cache_forks(chunk: int) -> None:
    """Two chats with different tool sets start together (chunked: the second finds only the first's
    first chunk cached, so its cut lands there, inside the system prompt). The next chat with the first
    tool set passes both the system prompt's end, where the cache forks (the tool sets differ), and its
    tool set's end: it saves both in one admission (one more prefill step than a single cut), so a chat
    with a third tool set restores the whole system prompt instead of that first chunk; every output
    equals a cold run."""
    engine = hybrid_engine(prefill_chunk_size=chunk)
    first = [tooled_chat("alpha", "q1"), tooled_chat("beta", "q2")]
    params = SamplingParams(max_tokens=40, temperature=0.0)
    for i, prompt in enumerate(first):
        engine.add_request(prompt, params, req_id=f"wave{i}")
    assert all(o.finish_reason != FinishReason.ERROR for o in drain(engine))
    system = shared_blocks(first) * BLOCK  # where the tool sets part
    chat = tooled_chat("alpha", "another question")
    tools = shared_blocks([first[0], chat]) * BLOCK
    assert system + 4 * BLOCK <= tools
    cuts = engine.scheduler.checkpoints
    assert cuts is not None
    saves = cuts.saves_total
    got, cached = run(engine, chat)
    assert cached == (chunk if chunk >= 4 * BLOCK else 0)  # the first wave's cut, if it took one
    assert got == run(hybrid_engine(prefill_chunk_size=chunk), chat)[0]
    third = tooled_chat("gamma", "q3")
    got, cached = run(engine, third)
    assert cached == system  # forked there: saved by the chat before, though it went on with alpha
    assert got == run(hybrid_engine(prefill_chunk_size=chunk), third)[0]
    assert cuts.saves_total > saves


def test_the_fork_points_of_a_cached_run_cost_one_step_each() -> None:
    """Unchunked, after two chats parted at the system prompt's end with its checkpoint pushed out: the
    next chat with the first tool set takes one prefill step per cut (system prompt, tool set, its own
    prompt boundary); with the fork cut off (MAX_SHARED_CUTS 1) only the run's end is saved."""
    from localchat.engine import hybrid_prefix

    def prepared() -> tuple[LLMEngine, list[list[int]]]:
        engine = hybrid_engine()
        first = [tooled_chat("alpha", "q1"), tooled_chat("beta", "q2")]
        for prompt in first:
            run(engine, prompt)
        checkpoints = engine.scheduler.checkpoints
        assert checkpoints is not None
        system_end = engine.block_manager.get_computed_blocks(_req(first[0]))[shared_blocks(first) - 1]
        checkpoints._drop(engine.block_manager.blocks[system_end].block_hash or 0)  # (pushed out)
        return engine, first

    engine, first = prepared()
    chat = tooled_chat("alpha", "q3")
    steps, _, cached = prefill_steps(engine, chat)
    assert (steps, cached) == (4, 0)
    third = tooled_chat("gamma", "q4")
    assert prefill_steps(engine, third)[2] == shared_blocks(first) * BLOCK
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hybrid_prefix, "MAX_SHARED_CUTS", 1)
        engine, first = prepared()
        steps, _, cached = prefill_steps(engine, chat)
        assert (steps, cached) == (3, 0)
        assert prefill_steps(engine, third)[2] == 0  # (now cut there, for the next one)


def test_eviction_keeps_shared_prefixes_over_chats_and_chats_over_passed_prompt_boundaries() -> None:
    cached = {1, 2, 3, 4, 5, 6, 7, 8}
    index = StateCheckpoints(first_slot=0, num_slots=4, is_cached=cached.__contains__)
    index.save(1, 16, slot=9, shared=True)  # where prompts part
    index.save(2, 16, slot=9, boundary=True)  # a prompt's boundary (block 1 of its chat)...
    index.save(3, 32, slot=9, owner="a")
    index.release("a")  # ...and the chat's decode checkpoint after it
    index.save(4, 16, slot=9, boundary=True)  # another chat's prompt boundary
    assert index.longest([2, 3], 16) == 2  # the chat's next turn: its last prompt boundary is passed
    index.end_step()
    index.save(5, 16, slot=9)  # so that one goes first, though the least recently used is the shared one
    assert 2 not in index and {1, 3, 4, 5} <= {h for h in range(9) if h in index}
    index.save(6, 16, slot=9)  # then chats' (least recently used first), never the shared prefix
    index.save(7, 16, slot=9)
    assert 1 in index and 3 not in index and 4 not in index
    cached.discard(1)  # a shared prefix whose blocks left the cache goes first
    index.save(8, 16, slot=9, boundary=True)
    assert 1 not in index and 8 in index
    # Shared prefixes holding more than half the rows rank with chats' (least recently used first).
    crowded = StateCheckpoints(first_slot=0, num_slots=4, is_cached=lambda h: True)
    for block_hash in (11, 12, 13):
        crowded.save(block_hash, 16, slot=9, shared=True)
    crowded.save(14, 16, slot=9)
    crowded.save(15, 16, slot=9)
    assert 11 not in crowded and 14 in crowded


def agent_waves(engine: LLMEngine, waves: int, turns: int = 3) -> dict[str, tuple[list[int], list[int], int]]:
    """Waves of four agents (tool sets alpha, beta, alpha, beta), each a few turns of its own chat with
    a tool result after each reply, run together: request id -> (prompt, output, cached tokens)."""
    params = SamplingParams(max_tokens=40, temperature=0.0)
    asked: dict[str, tuple[list[int], list[int], int]] = {}
    for wave in range(waves):
        chats = {
            a: tooled_chat(("alpha", "beta")[a % 2], f"<<say:done {wave}.{a} " + "w" * 20 + ">>")
            for a in range(4)
        }
        for turn in range(turns):
            ids = {a: f"w{wave}a{a}t{turn}" for a in chats}
            for a, req_id in ids.items():
                engine.add_request(chats[a], params, req_id=req_id)
            got: dict[str, list[int]] = {r: [] for r in ids.values()}
            cached: dict[str, int] = {}
            for out in drain(engine):
                got[out.req_id] += out.new_token_ids
                cached[out.req_id] = out.num_cached_tokens
            for a, req_id in ids.items():
                asked[req_id] = (chats[a], got[req_id], cached[req_id])
                result = FakeTokenizer().encode(
                    f"\n<|im_start|>tool\nresult {turn} " + "r" * 30 + "<|im_end|>\n"
                )
                chats[a] = chats[a] + got[req_id] + result
    return asked


def test_waves_of_agents_keep_their_tool_sets_checkpoints_between_waves() -> None:
    """Agents' turns save a decode checkpoint and a prompt boundary each, more than the 8 rows hold:
    under plain LRU they pushed out the system prompt + tool set checkpoints before the next wave came,
    whose agents then prefilled everything again. Ranked eviction keeps them: every agent of the later
    waves restores its tool set, and every output equals a cold run."""
    engine = hybrid_engine(max_num_seqs=4)
    asked = agent_waves(engine, waves=3)
    for wave in (1, 2):
        for a in range(4):
            prompt, _, cached = asked[f"w{wave}a{a}t0"]
            tools = shared_blocks([prompt, tooled_chat(("alpha", "beta")[a % 2], "?")]) * BLOCK
            assert cached >= tools, (wave, a)
    for req_id, (prompt, output, _) in asked.items():
        assert output == run(hybrid_engine(), prompt, max_tokens=40)[0], req_id


@pytest.mark.parametrize("chunk", [0, 7, 64])
def test_agents_with_several_tool_sets_under_preemption_match_running_alone(chunk: int) -> None:
    """Waves of agents over three tool sets, two turns each, in a pool small enough to preempt and with
    4 checkpoint rows: fork cuts, ranked eviction and restores happen mid-flight, and every output
    equals a cold run (the fake runner checks each row's state every step)."""
    engine = hybrid_engine(
        kv_bytes_per_token=1024, max_num_seqs=3, prefill_chunk_size=chunk, state_checkpoints=4
    )
    params = SamplingParams(max_tokens=30, temperature=0.0)
    asked: dict[str, list[int]] = {}
    got: dict[str, list[int]] = {}
    for wave in range(3):
        chats = {
            a: tooled_chat(("alpha", "beta", "gamma")[(a + wave) % 3], f"<<say:w{wave}a{a} {'v' * 9}>>")
            for a in range(3)
        }
        for turn in range(2):
            for a, chat in chats.items():
                asked[f"w{wave}a{a}t{turn}"] = chat
                got[f"w{wave}a{a}t{turn}"] = []
                engine.add_request(chat, params, req_id=f"w{wave}a{a}t{turn}")
            for out in drain(engine):
                got[out.req_id] += out.new_token_ids
            for a in chats:
                chats[a] = chats[a] + got[f"w{wave}a{a}t{turn}"] + FakeTokenizer().encode(f"\ntool {turn}\n")
    stats = engine.stats()
    assert engine.scheduler.num_preemptions > 0 and stats.state_checkpoint_restores_total > 0
    for req_id, prompt in asked.items():
        assert got[req_id] == run(hybrid_engine(), prompt, max_tokens=30)[0], req_id
