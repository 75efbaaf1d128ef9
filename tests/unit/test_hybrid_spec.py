"""Speculative decoding on hybrid models (engine/hybrid_spec.py), on the fake backend as a hybrid that
scores drafts.

The fake runner keeps, per state row, the tokens its sequence fed, writes a verify row's state after each
position into the spec rows `BatchInputs.state_keep` names, and raises (an error finish) when a row
continues from a state that is not exactly its context's first tokens. So after a verify step that kept
only some drafts, a missing or wrong fix-up copy (spec row -> live row) fails the request, and so does a
checkpoint saved from a state that holds rejected drafts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localchat.backends.fake import FakeRunner, FakeTokenizer
from localchat.engine.engine import LLMEngine
from localchat.engine.hybrid_spec import spec_rows_wanted
from localchat.engine.interface import BatchInputs
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.models.memory import estimate
from tests.helpers.fake_engine import chat_prompt, drain, engine_on
from tests.helpers.hybrid_config import TINY_QWEN3_5_STATE_BYTES, write_tiny_qwen3_5_config

STATE_BYTES = 1024
BLOCK = 16
# The reply, then a decoy that starts like it and then differs here and there: n-gram lookup follows the
# decoy (the latest occurrence), so drafts are kept for a while and then rejected part-way.
REPLY = "the cat sat on the mat and the cat ran to the hat and the dog sat on the log " * 2
DECOY = "the cat sat on the rug and the cat ran to the bat and the dog sat on the fog "


def engine_for(speculative: bool, kv_bytes_per_token: int = 128, **config: object) -> LLMEngine:
    spec = SpeculativeConfig("ngram", num_tokens=4) if speculative else SpeculativeConfig()
    runner = FakeRunner(kv_bytes_per_token=kv_bytes_per_token, state_bytes=STATE_BYTES, speculate=True)
    return engine_on(runner, **{"block_size": BLOCK, "speculative": spec, **config})


def prompt(i: int = 0) -> list[int]:
    return chat_prompt(f"<<say:{i} {REPLY}>> {i} {DECOY}")


def run_all(engine: LLMEngine, prompts: dict[str, list[int]], max_tokens: int = 200) -> dict[str, list[int]]:
    got: dict[str, list[int]] = {}
    for req_id, tokens in prompts.items():
        engine.add_request(tokens, SamplingParams(max_tokens=max_tokens, temperature=0.0), req_id=req_id)
        got[req_id] = []
    for out in drain(engine):  # raises on an error finish: the fake's state check among them
        got[out.req_id] += out.new_token_ids
    return got


def spec_rows_of(engine: LLMEngine) -> tuple[int, int]:
    rows = engine.scheduler.spec_rows
    assert rows is not None
    return rows.first, rows.count


def test_spec_rows_sit_after_the_slots_and_checkpoints() -> None:
    engine = engine_for(True)
    assert engine.speculation_note == "" and engine.scheduler.speculate
    assert engine.state_pool is not None
    first, count = spec_rows_of(engine)
    assert first == engine.state_pool.num_slots + 8 and count == 4 * 4  # max_batch x k
    runner = engine.runner
    assert isinstance(runner, FakeRunner)
    assert len(runner.states) == first + count
    run_all(engine, {"a": prompt()})
    assert runner.keep_rows_seen and runner.keep_rows_seen <= set(range(first, first + count))


def test_drafts_rejected_part_way_give_the_plain_output() -> None:
    engine = engine_for(True)
    got = run_all(engine, {"a": prompt()})
    plain = run_all(engine_for(False), {"a": prompt()})
    assert got == plain
    rows = engine.scheduler.spec_rows
    assert rows is not None and rows.fixups_total > 0  # some verify steps kept only part of the drafts
    assert 0 < engine.spec_accepted_tokens < engine.spec_draft_tokens
    assert engine.state_pool is not None and engine.state_pool.num_used == 0


def test_a_skipped_fix_up_is_caught() -> None:
    """What the tests rest on: without the copy back, the next step continues from a state holding the
    rejected drafts, and the fake fails the request."""
    engine = engine_for(True)
    rows = engine.scheduler.spec_rows
    assert rows is not None
    rows.accepted = lambda *args: None  # type: ignore[method-assign]
    engine.add_request(prompt(), SamplingParams(max_tokens=200, temperature=0.0), req_id="a")
    outs = [o for _ in range(200) if engine.has_unfinished for o in engine.step()]
    assert any(o.finish_reason == FinishReason.ERROR for o in outs)


def test_spec_rows_are_shared_out_per_step_and_cap_the_drafts() -> None:
    """Four sequences at once with only 6 spec rows: a step never hands out more drafts than rows."""
    engine = engine_for(True)  # max_batch 4, k 4
    rows = engine.scheduler.spec_rows
    assert rows is not None
    rows.count = 6
    seen: list[int] = []
    original = rows.keep_array

    def counted(batch: BatchInputs) -> np.ndarray | None:
        keep = original(batch)
        seen.append(0 if keep is None else int((keep >= 0).sum()))
        return keep

    rows.keep_array = counted  # type: ignore[method-assign]
    got = run_all(engine, {f"r{i}": prompt(i) for i in range(4)})
    assert max(seen) <= 6 and max(seen) > 0
    plain = run_all(engine_for(False), {f"r{i}": prompt(i) for i in range(4)})
    assert got == plain


@pytest.mark.parametrize("chunk", [0, 7])
def test_preemption_abort_and_checkpoints_stay_exact(chunk: int) -> None:
    """Speculating requests in a pool small enough to preempt, a regenerate and a next turn each (their
    restored checkpoints must hold exactly the kept tokens), and an abort mid-answer: every output equals
    a plain run's, and no slot is left taken."""
    engine = engine_for(True, kv_bytes_per_token=1024, max_num_seqs=4, prefill_chunk_size=chunk)
    prompts = {f"r{i}": prompt(i) for i in range(4)}
    got = run_all(engine, prompts)
    assert engine.scheduler.num_preemptions > 0
    assert engine.spec_accepted_tokens > 0
    follow = {}
    for req_id, tokens in prompts.items():
        follow[req_id + "again"] = tokens
        follow[req_id + "next"] = tokens + got[req_id] + FakeTokenizer().encode("\nmore<|im_end|>\n")
    again = run_all(engine, follow)
    assert engine.stats().state_checkpoint_restores_total > 0
    plain = engine_for(False)
    for req_id, tokens in {**prompts, **follow}.items():
        expected = run_all(plain, {req_id: tokens})[req_id]
        assert {**got, **again}[req_id] == expected, req_id
    engine.add_request(prompt(9), SamplingParams(max_tokens=200, temperature=0.0), req_id="x")
    for _ in range(12):
        engine.step()
    assert engine.spec_draft_tokens > 0
    engine.abort_request("x")
    assert engine.state_pool is not None and engine.state_pool.num_used == 0
    assert run_all(engine, {"y": prompt(3)})["y"] == run_all(plain, {"y": prompt(3)})["y"]


def test_checkpoint_moves_to_block_boundaries_a_verify_step_passed() -> None:
    """Verify steps jump over block boundaries; the sequence's decode checkpoint still visits each one
    (saved from the spec row holding that position's state), as in plain decoding, and the next turn
    restores from it (the fake checks the restored state)."""
    engine = engine_for(True)
    checkpoints = engine.scheduler.checkpoints
    assert checkpoints is not None
    first = prompt()
    engine.add_request(first, SamplingParams(max_tokens=200, temperature=0.0), req_id="a")
    visited: set[int] = set()
    reply: list[int] = []
    while engine.has_unfinished:
        reply += [t for o in engine.step() for t in o.new_token_ids]
        owned = checkpoints._owned.get("a")
        if owned is not None:
            visited.add(checkpoints._index[owned].num_tokens)
    boundaries = range(-(-len(first) // BLOCK) * BLOCK, len(first) + len(reply) - 2 * BLOCK, BLOCK)
    assert len(boundaries) >= 6 and set(boundaries) <= visited
    assert engine.spec_accepted_tokens > engine.sequence_passes  # steps kept several tokens at once
    nxt = first + reply + FakeTokenizer().encode("\nmore<|im_end|>\n")
    got = run_all(engine, {"b": nxt}, max_tokens=4)
    assert got == run_all(engine_for(False), {"b": nxt}, max_tokens=4)
    assert engine.stats().state_checkpoint_restores_total == 1


def test_off_with_a_reason_when_no_spec_row_fits_or_the_runner_cannot() -> None:
    tiny = engine_for(True, kv_cache_mib=1)
    assert tiny.speculation_note == ""
    ngram = {"block_size": BLOCK, "speculative": SpeculativeConfig("ngram")}
    big = engine_on(FakeRunner(state_bytes=2**19, speculate=True), model_max_len=256, **ngram)
    assert "holds no spec row" in big.speculation_note and not big.scheduler.speculate
    cannot = FakeRunner(state_bytes=STATE_BYTES, speculate=True)
    cannot.hybrid_speculation = False
    engine = engine_on(cannot, model_max_len=256, **ngram)
    assert "does not write the per-position recurrent states" in engine.speculation_note
    assert engine.scheduler.spec_rows is None and len(cannot.states) == engine.state_pool.num_slots + 8  # type: ignore[union-attr]


def test_the_ram_estimate_counts_the_spec_rows(tmp_path: Path) -> None:
    """max_batch (or max_num_seqs if fewer) x k spec rows when speculation may run (auto included; EAGLE
    and MTP heads on Qwen3.5 / Qwen3-Next too), none when off."""
    methods = ("ngram", "auto", "draft", "off", "eagle", "mtp")
    assert [spec_rows_wanted(method, 4, 32) for method in methods] == [16, 16, 16, 0, 16, 16]
    assert spec_rows_wanted("ngram", 4, 2) == 8  # no more sequences speculate than may run
    write_tiny_qwen3_5_config(tmp_path)
    per_sequence = TINY_QWEN3_5_STATE_BYTES
    base = estimate(tmp_path, None, max_num_seqs=4).kv_cache  # 4 slots + 8 checkpoints
    assert estimate(tmp_path, None, max_num_seqs=4, spec_rows=16).kv_cache == base + 16 * per_sequence
