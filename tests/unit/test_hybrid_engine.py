"""The engine's hybrid cache (state slots beside KV blocks) with a runner whose "model" is a recurrence.

`StateRunner` keeps one integer state per slot and folds every token it is fed into it, so its sampled
tokens depend on the whole context only through the state, as in a linear-attention layer. A slot that
is not reset for a new sequence, is shared by two running requests, or is lost between prefill chunks
gives different tokens from `reference`, which folds the whole sequence in one go.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localchat.backends.fake import BYTE_OFFSET
from localchat.engine.block_manager import BlockManager
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import (
    BatchInputs,
    KVCacheSpec,
    RunnerOutput,
    SchedulerOutput,
    StateCacheSpec,
)
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler
from localchat.engine.state_slots import StateSlotPool
from localchat.models.memory import MIN_KV_BUDGET, estimate
from tests.helpers.fake_engine import drain, engine_on
from tests.helpers.hybrid_config import TINY_QWEN3_5_STATE_BYTES, write_tiny_qwen3_5_config

STATE_BYTES = 1024
RESTORED = "<restored>"


def _fold(state: int, token: int) -> int:
    return (state * 31 + token + 7) % 1_000_003


def _token(state: int) -> int:
    return BYTE_OFFSET + state % 200  # never EOS: requests run to max_tokens


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    state, out = 0, []
    for t in prompt:
        state = _fold(state, t)
    for _ in range(max_tokens):
        out.append(_token(state))
        state = _fold(state, out[-1])
    return out


class StateRunner:
    def __init__(self, head_dim: int = 8) -> None:
        self.head_dim = head_dim
        self.states: list[int] = []
        self.owners: list[str | None] = []
        self.max_rows_per_step = 0
        self.steps_with_prefill_and_decode = 0

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_layers=1, num_kv_heads=1, head_dim=self.head_dim, dtype_bytes=1)

    @property
    def state_cache_spec(self) -> StateCacheSpec:
        return StateCacheSpec(num_layers=1, bytes_per_slot=STATE_BYTES)

    @property
    def device_name(self) -> str:
        return "state-fake"

    def available_kv_memory(self) -> int | None:
        return None

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        pass

    def initialize_state_cache(self, num_slots: int) -> None:
        self.states = [0] * num_slots
        self.owners = [None] * num_slots

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        assert batch.state_slots is not None, "a hybrid model's batch names each row's state slot"
        slots = [int(s) for s in batch.state_slots]
        assert len(set(slots)) == len(slots), f"two rows share a state slot: {slots}"
        qsl = batch.query_start_loc
        lens = np.diff(qsl)
        self.max_rows_per_step = max(self.max_rows_per_step, batch.num_reqs)
        if (lens == 1).any() and (lens > 1).any():
            self.steps_with_prefill_and_decode += 1
        tokens: dict[str, int] = {}
        for source, dest in batch.state_copies:  # prefix checkpoints: saved or restored, in order
            self.states[dest], self.owners[dest] = self.states[source], RESTORED
        for row, req_id in enumerate(batch.req_ids):
            slot, start, end = slots[row], int(qsl[row]), int(qsl[row + 1])
            if batch.positions[start] == 0:
                self.states[slot], self.owners[slot] = 0, req_id
            elif self.owners[slot] == RESTORED:  # a checkpoint restored into this request's new slot
                self.owners[slot] = req_id
            assert self.owners[slot] == req_id, f"{req_id} continues from {self.owners[slot]}'s state"
            for t in batch.input_ids[start:end]:
                self.states[slot] = _fold(self.states[slot], int(t))
            tokens[req_id] = _token(self.states[slot])
        return RunnerOutput.one_token_each(batch.sample_req_ids, [tokens[r] for r in batch.sample_req_ids])

    def shutdown(self) -> None:
        pass


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(BYTE_OFFSET, 250, size=n)] for n in (5, 23, 1, 40, 17, 9)]


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ids = [engine.add_request(p, params, req_id=f"r{i}") for i, p in enumerate(prompts)]
    got: dict[str, list[int]] = {i: [] for i in ids}
    for out in drain(engine):
        got[out.req_id] += out.new_token_ids
    return got


def test_chunked_prefill_and_batched_decode_continue_each_sequences_state():
    runner = StateRunner()
    engine = engine_on(runner, prefill_chunk_size=4, max_num_batched_tokens=12, max_num_seqs=4)
    prompts = _prompts()
    got = _run(engine, prompts, max_tokens=12)
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"] == reference(prompt, 12), f"r{i}"
    assert runner.max_rows_per_step > 1  # sequences really ran together
    assert runner.steps_with_prefill_and_decode > 0  # decode and prefill rows shared steps
    stats = engine.stats()
    assert (stats.state_slots_used, stats.state_slots_total) == (0, 4)
    assert stats.state_bytes_per_slot == STATE_BYTES


def test_preemption_frees_the_slot_and_recomputes_the_state():
    # About 8 blocks of 16 tokens for 4 sequences growing to ~50 tokens each: preemption is certain.
    budget = 2**20 - (4 + 8) * STATE_BYTES  # 4 running slots and 8 prefix checkpoints
    runner = StateRunner(head_dim=budget // (8 * 2 * 16))
    engine = engine_on(runner, prefill_chunk_size=8, max_num_batched_tokens=32, max_num_seqs=4)
    assert engine.block_manager.num_usable_blocks == 8  # the state pool came out of the same budget
    prompts = _prompts()[:4]
    got = _run(engine, prompts, max_tokens=24)
    assert engine.scheduler.num_preemptions > 0
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"] == reference(prompt, 24), f"r{i}"
    assert engine.state_pool is not None and engine.state_pool.num_used == 0


def test_prefix_caching_reuses_a_checkpointed_prefix():
    engine = engine_on(StateRunner(), enable_prefix_caching=True)
    assert engine.block_manager.enable_prefix_caching and engine.stats().prefix_caching_enabled
    prompt = _prompts()[3]
    first = _run(engine, [prompt], 6)["r0"]
    second = _run(engine, [prompt], 6)["r0"]  # restored from the prompt's checkpoint at token 32
    assert first == second == reference(prompt, 6)
    assert engine.block_manager.prefix_hits == 32


def test_prefix_caching_is_off_for_hybrid_models_without_checkpoints():
    engine = engine_on(StateRunner(), enable_prefix_caching=True, state_checkpoints=0)
    assert not engine.block_manager.enable_prefix_caching
    assert "recurrent state" in engine.prefix_caching_note  # --state-checkpoints 0: none is kept
    assert not engine.stats().prefix_caching_enabled
    # The same prompt twice: the second run recomputes everything and still gets the same tokens.
    prompt = _prompts()[3]
    first = _run(engine, [prompt], 6)["r0"]
    second = _run(engine, [prompt], 6)["r0"]
    assert first == second == reference(prompt, 6)
    assert engine.block_manager.prefix_hit_rate == 0.0


def test_admission_waits_for_a_free_state_slot():
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, prefill_chunk_size=0)
    pool = StateSlotPool(2)
    scheduler = Scheduler(config, BlockManager(64, 16, enable_prefix_caching=False), pool)
    requests = [Request(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=4)) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["r0", "r1"]  # blocks for all, slots for two
    assert pool.num_free == 0 and len(scheduler.waiting) == 1
    assert sorted(pool.slots.values()) == [0, 1]
    for request in requests[:2]:
        request.num_computed_tokens = 3
    from localchat.engine.request import FinishReason

    scheduler.finish_request(requests[0], FinishReason.STOP)
    out = scheduler.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["r2"]
    assert pool.slots["r2"] == 0  # r0's slot, handed on


@pytest.mark.parametrize("num_slots", [1, 3])
def test_pool_hands_out_each_slot_once(num_slots: int):
    pool = StateSlotPool(num_slots)
    got = [pool.allocate(f"r{i}") for i in range(num_slots)]
    assert sorted(got) == list(range(num_slots))  # type: ignore[type-var]
    assert pool.allocate("extra") is None
    assert pool.allocate("r0") == got[0]  # idempotent for a holder
    pool.free("r0")
    pool.free("r0")  # twice is harmless
    assert pool.num_free == 1 and pool.allocate("extra") == got[0]


def test_memory_estimate_counts_the_state_pool(tmp_path: Path) -> None:
    write_tiny_qwen3_5_config(tmp_path)
    per_sequence = TINY_QWEN3_5_STATE_BYTES
    assert (
        estimate(tmp_path, None, max_num_seqs=4, state_checkpoints=0).kv_cache
        == MIN_KV_BUDGET + 4 * per_sequence
    )
    # and the prefix checkpoints (engine/state_checkpoints.py), 8 unless --state-checkpoints says otherwise
    assert estimate(tmp_path, None, max_num_seqs=4).kv_cache == MIN_KV_BUDGET + 12 * per_sequence
    # --mem: the engine takes the pool out of that budget, so the estimate is the budget itself
    assert estimate(tmp_path, 64, max_num_seqs=4).kv_cache == 64 * 2**20
    write_tiny_qwen3_5_config(tmp_path, model_type="qwen3")
    assert estimate(tmp_path, None, max_num_seqs=4).kv_cache == MIN_KV_BUDGET  # no state for transformers


def test_a_small_budget_gets_fewer_state_slots_not_an_error():
    # 1 MiB with 1 KiB slots: 8 checkpoints first, then the pool may take half of the rest, 508 slots,
    # whatever max_num_seqs asks for.
    engine = engine_on(StateRunner(), max_num_seqs=4096, max_num_batched_tokens=8192)
    assert engine.state_pool is not None and engine.state_pool.num_slots == 508
    assert engine.block_manager.num_usable_blocks > 0
    got = _run(engine, _prompts()[:2], max_tokens=3)
    assert got["r0"] == reference(_prompts()[0], 3)
