"""Speculative decoding and prefix caching together on a hybrid model (engine/hybrid_spec.py with
engine/hybrid_prefix.py and engine/state_checkpoints.py), on the fake backend as a hybrid that scores
drafts.

The fake runner keeps, per state row, the tokens its sequence fed, writes a verify row's per-position
states into the spec rows `BatchInputs.state_keep` names, and fails a request whose row continues from a
state that is not exactly its context. So a copy back that lands after a checkpoint save read the live
row, a checkpoint saved from a row holding rejected drafts, a restore that is skipped or overwritten,
or a pending copy into a row that was handed on all fail the run, and every output is compared with a
cold run without speculation.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from localchat.backends.fake import EOS_ID, FakeRunner, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from tests.helpers.fake_engine import chat_prompt, drain

STATE_BYTES = 1024
BLOCK = 16
SYSTEM = (
    "<|im_start|>system\nYou are an agent. Tools: " + "{'name': 'search', 'args': ...} " * 6 + "<|im_end|>\n"
)
# The scripted reply repeats itself, and the prompt carries a decoy that starts like it and then differs:
# n-gram lookup proposes drafts that are kept for a while and then rejected part-way.
REPLY = "the cat sat on the mat and the cat ran to the hat and the dog sat on the log "
DECOY = "the cat sat on the rug and the cat ran to the bat and the dog sat on the fog "


def engine(speculative: bool, kv_bytes_per_token: int = 128, **config: object) -> LLMEngine:
    spec = SpeculativeConfig("ngram", num_tokens=4) if speculative else SpeculativeConfig()
    cfg = EngineConfig(**{"kv_cache_mib": 1, "block_size": BLOCK, "speculative": spec, **config})  # type: ignore[arg-type]
    runner = FakeRunner(kv_bytes_per_token=kv_bytes_per_token, state_bytes=STATE_BYTES, speculate=True)
    return LLMEngine(runner, FakeTokenizer(), cfg, eos_token_ids=[EOS_ID], model_max_len=4096)


def agent_chat(tools: str, tag: str) -> list[int]:
    """An agent's new chat: the shared system prompt, one of its tool sets, then its own message, whose
    scripted reply repeats itself (with the decoy in the prompt)."""
    schemas = "".join(f"{{'name': '{tools}{i}', 'args': '...'}} " for i in range(4))
    return FakeTokenizer().encode(SYSTEM) + chat_prompt(f"{schemas}\n<<say:{tag} {REPLY * 2}>> {tag} {DECOY}")


def tool_turn(turn: int) -> list[int]:
    return FakeTokenizer().encode(
        f"\n<|im_start|>tool\nresult {turn} {DECOY}<|im_end|>\n<|im_start|>assistant\n"
    )


def cold(prompt: list[int], max_tokens: int) -> list[int]:
    """The prompt run alone on a fresh engine without speculation."""
    plain = engine(False)
    plain.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), req_id="cold")
    return [t for out in drain(plain) for t in out.new_token_ids]


def agent_waves(
    eng: LLMEngine, waves: int, turns: int, max_tokens: int
) -> dict[str, tuple[list[int], list[int]]]:
    """Waves of three agents over three tool sets, `turns` turns each (the reply and a tool result
    appended), plus a regenerate of each agent's first turn added while the others speculate.
    Request id -> (prompt, output)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    asked: dict[str, tuple[list[int], list[int]]] = {}
    for wave in range(waves):
        chats = {a: agent_chat(("alpha", "beta", "gamma")[(a + wave) % 3], f"w{wave}a{a}") for a in range(3)}
        for turn in range(turns):
            prompts = {f"w{wave}a{a}t{turn}": chat for a, chat in chats.items()}
            if turn == 1:  # regenerate the first turn's answers while the next turns run
                prompts |= {f"w{wave}a{a}again": asked[f"w{wave}a{a}t0"][0] for a in chats}
            got: dict[str, list[int]] = {}
            for req_id, prompt in prompts.items():
                eng.add_request(prompt, params, req_id=req_id)
                got[req_id] = []
            for out in drain(eng):
                got[out.req_id] += out.new_token_ids
            asked |= {req_id: (prompts[req_id], tokens) for req_id, tokens in got.items()}
            for a in chats:
                chats[a] = chats[a] + got[f"w{wave}a{a}t{turn}"] + tool_turn(turn)
    return asked


@pytest.mark.parametrize("chunk", [0, 24, 64])
def test_agent_waves_speculating_under_preemption_equal_cold_runs(chunk: int) -> None:
    """Agents sharing a system prompt over three tool sets with n-gram speculation (drafts rejected
    part-way), next turns and regenerates mixed in, in a pool small enough to preempt and with 4
    checkpoint rows: fork cuts, ranked eviction, restores, copy backs and checkpoints moved from spec
    rows all happen mid-flight; every output equals a cold run without speculation."""
    eng = engine(True, kv_bytes_per_token=1024, max_num_seqs=4, prefill_chunk_size=chunk, state_checkpoints=4)
    asked = agent_waves(eng, waves=2, turns=2, max_tokens=60)
    stats = eng.stats()
    spec_rows = eng.scheduler.spec_rows
    assert spec_rows is not None and spec_rows.fixups_total > 0
    assert 0 < eng.spec_accepted_tokens < eng.spec_draft_tokens
    assert eng.scheduler.num_preemptions > 0
    assert stats.state_checkpoint_restores_total > 0 and stats.state_checkpoint_saves_total > 0
    assert eng.state_pool is not None and eng.state_pool.num_used == 0
    for req_id, (prompt, output) in asked.items():
        assert output == cold(prompt, 60), req_id


def test_agent_waves_with_room_restore_their_tool_sets_while_speculating() -> None:
    """With room to run (no preemption, 8 checkpoint rows), the second wave's first turns restore their
    tool set's shared prefix saved by the first wave, whose agents speculated meanwhile."""
    eng = engine(True, max_num_seqs=4)
    asked = agent_waves(eng, waves=2, turns=2, max_tokens=60)
    assert eng.scheduler.num_preemptions == 0
    assert eng.stats().state_checkpoint_restores_total >= 6  # regenerates, next turns, new chats
    assert 0 < eng.spec_accepted_tokens < eng.spec_draft_tokens
    for req_id, (prompt, output) in asked.items():
        assert output == cold(prompt, 60), req_id


def test_without_checkpoints_speculation_still_runs() -> None:
    """--state-checkpoints 0: prefix caching off (no checkpoint rows), the spec rows sit right after the
    running slots, and speculating agents still equal cold runs."""
    eng = engine(True, max_num_seqs=4, state_checkpoints=0)
    assert eng.scheduler.checkpoints is None and eng.prefix_caching_note
    assert eng.state_pool is not None
    spec_rows = eng.scheduler.spec_rows
    assert spec_rows is not None and spec_rows.first == eng.state_pool.num_slots
    asked = agent_waves(eng, waves=1, turns=2, max_tokens=60)
    assert spec_rows.fixups_total > 0
    for req_id, (prompt, output) in asked.items():
        assert output == cold(prompt, 60), req_id


def turns_ending_on_every_offset(eng: LLMEngine) -> None:
    """Sixteen chats whose replies end at every offset within a block, then their next turns, each
    equal to a cold run. A reply's last verify step rejects its drafts (the reply ends where n-gram
    lookup goes on), so one of them finishes on a block boundary right after a copy back, and its decode
    checkpoint, saved at that end, is what its next turn restores."""
    params = SamplingParams(max_tokens=200, temperature=0.0)
    prompts = {f"c{pad}": chat_prompt(f"<<say:{REPLY}>> {'x' * pad} {DECOY}") for pad in range(BLOCK)}
    got: dict[str, list[int]] = {r: [] for r in prompts}
    for req_id, prompt in prompts.items():
        eng.add_request(prompt, params, req_id=req_id)
    for out in drain(eng):
        got[out.req_id] += out.new_token_ids
    follow = {
        r + "next": p + got[r] + FakeTokenizer().encode("\nmore<|im_end|>\n") for r, p in prompts.items()
    }
    for req_id, prompt in follow.items():
        eng.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0), req_id=req_id)
        got[req_id] = []
    for out in drain(eng):
        got[out.req_id] += out.new_token_ids
    for req_id, prompt in {**prompts, **follow}.items():
        assert got[req_id] == cold(prompt, 200 if req_id in prompts else 8), req_id


def test_the_copy_back_lands_before_the_saves_that_read_the_live_row() -> None:
    """The order the exactness rests on: with the checkpoint copies run before the copy back, the
    checkpoint saved as a request ends on a block boundary right after a verify step that rejected
    drafts holds them, and the next turn that restores it fails (the fake checks the restored state)."""
    eng = engine(True, max_num_seqs=4, state_checkpoints=40)  # (rows for every chat's checkpoints)
    turns_ending_on_every_offset(eng)
    spec_rows = eng.scheduler.spec_rows
    assert spec_rows is not None and spec_rows.fixups_total > 0
    assert eng.stats().state_checkpoint_restores_total >= BLOCK
    eng = engine(True, max_num_seqs=4, state_checkpoints=40)
    scheduler = eng.scheduler

    def saves_first(step_runs: bool) -> list[tuple[int, int]]:
        spec_rows, checkpoints = scheduler.spec_rows, scheduler.checkpoints
        assert spec_rows is not None and checkpoints is not None
        fixups = spec_rows.end_step(step_runs)
        return checkpoints.end_step() + fixups if step_runs else []

    scheduler._state_copies = saves_first  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="finished with an error"):
        turns_ending_on_every_offset(eng)


class _FailOnce:
    """Wraps the fake runner: the first step that carries a state copy into a running row none of its
    own rows use (a copy back for a sequence left out of the step) raises before its forward, so its copies never
    run."""

    def __init__(self, runner: FakeRunner, num_slots: int) -> None:
        self.runner, self.num_slots, self.failed_step, self.steps = runner, num_slots, -1, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        self.steps += 1
        rows = set() if batch.state_slots is None else {int(r) for r in batch.state_slots}
        live = {dst for _, dst in batch.state_copies if dst < self.num_slots}  # (not a checkpoint save)
        if self.failed_step < 0 and live - rows:
            self.failed_step = self.steps
            raise RuntimeError("injected step failure")
        return self.runner.execute_model(scheduler_output, batch)


def test_a_failed_step_fails_the_sequences_whose_copy_back_it_carried() -> None:
    """Four sequences speculate under a token budget of 8 a step, so the last are left out of some steps
    right after one of its verify steps kept only part of its drafts: its copy back rides on a step it is
    not in. When that step fails before its copies run, the sequence's row still holds the rejected
    drafts; it must fail with the step rather than go on from that state (the fake's state check, or with
    a real model wrong tokens). The others equal cold runs or fail with the step."""
    eng = engine(True, max_num_seqs=4, max_num_batched_tokens=8, prefill_chunk_size=8)
    runner = eng.runner
    assert isinstance(runner, FakeRunner)
    assert eng.state_pool is not None
    failing = _FailOnce(runner, eng.state_pool.num_slots)
    eng.runner = failing
    params = SamplingParams(max_tokens=120, temperature=0.0)
    prompt = FakeTokenizer().encode(SYSTEM) + chat_prompt(f"<<say:{REPLY * 2}>> {DECOY}")
    prompts = {r: prompt for r in ("w", "x", "y", "z")}
    for req_id in prompts:
        eng.add_request(prompt, params, req_id=req_id)
    outs = [o for _ in range(2000) if eng.has_unfinished for o in eng.step()]
    assert failing.failed_step > 0 and not eng.has_unfinished
    errors = {o.req_id: o.error for o in outs if o.finish_reason == FinishReason.ERROR}
    assert errors and all("injected step failure" in str(error) for error in errors.values()), errors
    for req_id in prompts:
        if req_id not in errors:
            assert [t for o in outs if o.req_id == req_id for t in o.new_token_ids] == cold(prompt, 120)
    # The engine runs on: a new request equals a cold run.
    eng.add_request(agent_chat("beta", "b"), params, req_id="b")
    assert [t for o in drain(eng) for t in o.new_token_ids] == cold(agent_chat("beta", "b"), 120)


@pytest.mark.parametrize("seed", range(8))
def test_random_traffic_keeps_every_state_exact(seed: int) -> None:
    """Random traffic on random configurations (chunk, pool size, sequences, checkpoint rows, token
    budget): new agent chats, next turns of finished ones, regenerates, aborts at any step, all with
    n-gram speculation. The fake checks every row's state at every step (a live row, a restore, a
    checkpoint saved from a live or a spec row), so any state out of step fails the run."""
    rnd = random.Random(seed)
    chunk = rnd.choice([0, 7, 16, 24, 64])
    eng = engine(
        True,
        kv_bytes_per_token=rnd.choice([256, 512, 1024]),
        max_num_seqs=rnd.choice([2, 3, 4, 6]),
        prefill_chunk_size=chunk,
        state_checkpoints=rnd.choice([1, 2, 4, 8]),
        max_num_batched_tokens=rnd.choice([8, 32, 2048]) if chunk else 2048,
    )
    prompts: dict[str, list[int]] = {}
    got: dict[str, list[int]] = {}
    for step in range(400):
        if rnd.random() < 0.15 and len(prompts) < 30:
            done = [r for r in prompts if r not in eng.scheduler.requests]
            if done and rnd.random() < 0.4:
                base = rnd.choice(done)
                prompt = prompts[base] + (got[base] + tool_turn(step) if rnd.random() < 0.7 else [])
            else:
                prompt = agent_chat(rnd.choice(["alpha", "beta", "gamma"]), f"t{rnd.randrange(5)}")
            if len(prompt) + 80 > eng.max_model_len:
                continue
            req_id = f"r{len(prompts)}"
            prompts[req_id], got[req_id] = prompt, []
            params = SamplingParams(max_tokens=rnd.choice([10, 40, 80]), temperature=0.0)
            eng.add_request(prompt, params, req_id=req_id)
        if rnd.random() < 0.03 and eng.scheduler.requests:
            eng.abort_request(rnd.choice(list(eng.scheduler.requests)))
        for out in eng.step():
            assert out.finish_reason != FinishReason.ERROR, out.error
            got[out.req_id] += out.new_token_ids
    for out in drain(eng):
        got[out.req_id] += out.new_token_ids
    assert eng.spec_draft_tokens > 0
    assert eng.state_pool is not None and eng.state_pool.num_used == 0
