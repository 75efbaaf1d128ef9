"""The decode-only batch path (engine/batch.py `_decode_batch`, `decode_sampling_inputs`) builds exactly
what the general path builds, field by field (dtype, shape, values), on every step of a scheduler run
that crosses block boundaries, admits, preempts and finishes requests; steps it must not take (a prefill
chunk, draft tokens) go the general way."""

from __future__ import annotations

import numpy as np
import pytest

from localchat.engine import batch as batch_module
from localchat.engine.batch import build_batch
from localchat.engine.block_manager import BlockManager
from localchat.engine.config import EngineConfig
from localchat.engine.interface import BatchInputs, SchedulerOutput
from localchat.engine.request import FinishReason, Request
from localchat.engine.sampling_inputs import SamplingInputs, build_sampling_inputs, decode_sampling_inputs
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler

BS = 4


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        assert np.array_equal(a, b), (where, a, b)
    elif isinstance(a, SamplingInputs):
        assert isinstance(b, SamplingInputs), where
        for name in SamplingInputs.__slots__:
            if name != "derived":  # (shared inputs answer these three from it)
                _same(getattr(a, name), getattr(b, name), f"{where}.{name}")
        _same(a.penalized_rows, b.penalized_rows, f"{where}.penalized_rows")
        assert (a.wants_logprobs, a.all_greedy) == (b.wants_logprobs, b.all_greedy), where
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def assert_same_batch(fast: BatchInputs, general: BatchInputs) -> None:
    for name in BatchInputs.__slots__:
        _same(getattr(fast, name), getattr(general, name), name)


def general_batch(
    out: SchedulerOutput, requests: dict[str, Request], slots: dict[str, int] | None
) -> BatchInputs:
    saved = batch_module._decode_rows
    batch_module._decode_rows = lambda *args: None
    try:
        return build_batch(out, requests, BS, slots)
    finally:
        batch_module._decode_rows = saved


PARAMS = [
    SamplingParams(temperature=0, max_tokens=11),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=3, max_tokens=9),
    SamplingParams(temperature=0.5, presence_penalty=0.5, repetition_penalty=1.2, max_tokens=7),
    SamplingParams(temperature=0, logit_bias={3: -100.0, 5: 2.0}, logprobs=2, max_tokens=8),
    SamplingParams(temperature=1.0, min_p=0.1, logprobs=0, seed=2**63, max_tokens=10),
]


@pytest.mark.parametrize("num_blocks", [64, 12])  # 12: the pool runs out and the scheduler preempts
def test_every_step_matches_the_general_path(num_blocks: int) -> None:
    config = EngineConfig(
        block_size=BS, watermark_fraction=0.0, max_num_batched_tokens=32, prefill_chunk_size=6
    )
    s = Scheduler(config, BlockManager(num_blocks, BS))
    for i, params in enumerate(PARAMS):
        s.add_request(Request(f"r{i}", [10 * i + k for k in range(3 + 2 * i)], params))
    decode_steps = fast_steps = 0
    for step in range(60):
        if not s.has_unfinished:
            break
        out = s.schedule()
        if out.is_empty:
            continue
        slots = {r: 100 + j for j, r in enumerate(out.num_scheduled_tokens)}
        fast = build_batch(out, s.requests, BS, slots)
        assert_same_batch(fast, general_batch(out, s.requests, slots))
        decoding = all(n == 1 for n in out.num_scheduled_tokens.values())
        decode_steps += decoding
        fast_steps += batch_module._decode_rows(out, s.requests, BS) is not None
        for req_id, count in out.num_scheduled_tokens.items():
            s.requests[req_id].num_computed_tokens += count
        for row, req_id in enumerate(fast.sample_req_ids):
            request = s.requests[req_id]
            request.append_output_token(7 + (step + row) % 5)
            if request.num_output_tokens >= request.sampling_params.max_tokens:
                s.finish_request(request, FinishReason.LENGTH)
    assert not s.has_unfinished
    assert decode_steps >= 5 and fast_steps == decode_steps
    assert (s.num_preemptions > 0) == (num_blocks == 12)


def test_prefill_chunks_and_drafts_take_the_general_path() -> None:
    request = Request("a", list(range(10)), SamplingParams(temperature=0))
    request.block_ids = [1, 2, 3]
    request.num_computed_tokens = 4  # a prompt's middle: 6 tokens left
    assert batch_module._decode_rows(SchedulerOutput([], [], {"a": 1}, 1), {"a": request}, BS) is None
    request.num_computed_tokens = 9
    out = SchedulerOutput([], [], {"a": 1}, 1)
    assert batch_module._decode_rows(out, {"a": request}, BS) == [request]
    request.spec_token_ids = [4, 5]
    out = SchedulerOutput([], [], {"a": 3}, 3)
    assert batch_module._decode_rows(out, {"a": request}, BS) is None
    assert batch_module._decode_rows(SchedulerOutput([], [], {}, 0), {}, BS) is None


def test_shared_sampling_arrays_are_read_only_and_follow_the_params() -> None:
    tokens = [1, 2, 3, 4]
    greedy = SamplingParams(temperature=0)
    first = decode_sampling_inputs([(greedy, tokens, 2)])
    again = decode_sampling_inputs([(SamplingParams(temperature=0), [*tokens, 5], 2)])
    assert again.temperature is first.temperature  # the same values: the same arrays
    assert again.derived is first.derived and not again.penalized_rows.flags.writeable
    assert again.token_index.tolist() == [3] and first.token_index.tolist() == [2]
    with pytest.raises(ValueError, match="read-only"):
        again.temperature[0] = 1.0
    warm = decode_sampling_inputs([(SamplingParams(temperature=0.5), tokens, 2)])
    assert warm.temperature.tolist() == [0.5] and warm.temperature is not first.temperature
    penalized = SamplingParams(temperature=0, frequency_penalty=0.5)
    built = decode_sampling_inputs([(penalized, tokens, 2)])  # penalty rows: built fresh every step
    _same(built, build_sampling_inputs([(penalized, tokens, 2)]), "penalized")
    assert built.frequency_penalty.flags.writeable
