"""The engine's per-step sampling inputs: one row per sampled request, CSR penalty and bias data."""

from __future__ import annotations

import numpy as np

from localchat.engine.batch import build_batch
from localchat.engine.interface import SchedulerOutput
from localchat.engine.request import Request
from localchat.engine.sampling_inputs import build_sampling_inputs
from localchat.engine.sampling_params import SamplingParams


def test_rows_carry_params_seeds_and_token_index() -> None:
    rows = [
        (SamplingParams(temperature=0.0), [1, 2, 3], 3),
        (
            SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, seed=-1, logprobs=2),
            [1, 2, 9, 9],
            2,
        ),
    ]
    inputs = build_sampling_inputs(rows)
    assert inputs.temperature.dtype == np.float32 and inputs.top_k.dtype == np.int32
    assert inputs.temperature.tolist() == [0.0, np.float32(0.7)] and inputs.top_k.tolist() == [0, 5]
    assert inputs.has_seed.tolist() == [False, True] and int(inputs.seed[1]) == 2**64 - 1  # -1 mod 2**64
    assert inputs.token_index.tolist() == [0, 2]  # output tokens so far
    assert inputs.num_logprobs.tolist() == [-1, 2]
    assert not inputs.all_greedy and inputs.wants_logprobs and len(inputs.penalized_rows) == 0
    assert len(inputs.penalty_token_ids) == 0  # only penalized rows send their tokens


def test_penalty_tokens_and_logit_bias_are_csr_and_take_keeps_them_aligned() -> None:
    rows = [
        (SamplingParams(presence_penalty=1.0), [4, 5, 6, 6], 2),
        (SamplingParams(logit_bias={3: 2.0, 8: -100.0}), [1], 1),
        (SamplingParams(repetition_penalty=1.2, logit_bias={0: 1.0}), [7, 8, 8], 1),
    ]
    inputs = build_sampling_inputs(rows)
    assert inputs.penalized_rows.tolist() == [0, 2]
    seen_row, seen_id, out_row, out_id = inputs.penalty_rows(inputs.penalized_rows)
    assert list(zip(seen_row.tolist(), seen_id.tolist(), strict=True)) == [
        (0, 4),
        (0, 5),
        (0, 6),
        (0, 6),
        (1, 7),
        (1, 8),
        (1, 8),
    ]
    assert list(zip(out_row.tolist(), out_id.tolist(), strict=True)) == [(0, 6), (0, 6), (1, 8), (1, 8)]
    bias_rows, ids, values = inputs.bias_rows()
    assert bias_rows.tolist() == [1, 1, 2] and ids.tolist() == [3, 8, 0]
    assert values.tolist() == [2.0, -np.inf, 1.0]  # -100 bans

    last_two = inputs.take([2, 1])
    assert last_two.penalized_rows.tolist() == [0]
    _, seen_id, _, out_id = last_two.penalty_rows(last_two.penalized_rows)
    assert seen_id.tolist() == [7, 8, 8] and out_id.tolist() == [8, 8]
    bias_rows, ids, _ = last_two.bias_rows()
    assert bias_rows.tolist() == [0, 1, 1] and ids.tolist() == [0, 3, 8]


def test_the_batch_builder_aligns_rows_with_sample_req_ids() -> None:
    seeded = Request("seeded", [1, 2, 3], SamplingParams(temperature=1.0, seed=7), output_token_ids=[5, 6])
    seeded.num_computed_tokens = 4  # resumed: the last output token is still to compute
    seeded.block_ids = [1]
    chunked = Request("chunked", list(range(10)), SamplingParams(temperature=0.0))
    chunked.block_ids = [2, 3]
    out = SchedulerOutput([], [], {"seeded": 1, "chunked": 4}, 5)
    batch = build_batch(out, {"seeded": seeded, "chunked": chunked}, block_size=8)
    assert batch.sample_req_ids == ["seeded"]  # the chunk does not reach the prompt's end
    assert batch.sampling is not None and batch.sampling.num_rows == 1
    assert batch.sampling.token_index.tolist() == [2] and batch.sampling.has_seed.tolist() == [True]
