"""The draft distributions q travel with their rows: build_batch puts a sampling draft model's q on the
rows that verify those drafts (not on the bonus row), and SamplingInputs.take keeps them aligned when the
runner drops rows (embedding requests in the same step)."""

from __future__ import annotations

import numpy as np

from localchat.engine.batch import build_batch
from localchat.engine.interface import CachedRequestData, SchedulerOutput
from localchat.engine.request import Request
from localchat.engine.sampling_inputs import build_sampling_inputs
from localchat.engine.sampling_params import SamplingParams


def test_build_batch_sends_q_for_the_draft_rows_only() -> None:
    plain = Request("a", [1, 2, 3], SamplingParams(temperature=0.0))
    plain.num_computed_tokens = 2
    drafted = Request("b", [4, 5, 6, 7], SamplingParams(temperature=1.0))
    drafted.num_computed_tokens = 3
    drafted.block_ids = plain.block_ids = [1]
    drafted.spec_token_ids = [8, 9]
    q = [np.full(10, 0.1, dtype=np.float32), np.eye(10, dtype=np.float32)[9]]
    drafted.spec_draft_probs = [*q, np.zeros(10, dtype=np.float32)]  # longer than the drafts kept
    out = SchedulerOutput(
        [], [CachedRequestData("a", [], 2), CachedRequestData("b", [], 3)], {"a": 1, "b": 3}, 4
    )
    sampling = build_batch(out, {"a": plain, "b": drafted}, block_size=16).sampling
    assert sampling is not None and sampling.num_rows == 4  # a; b at its last token, after 8, after 9
    assert sampling.spec_rows is not None and sampling.spec_rows.tolist() == [1, 2]
    assert sampling.spec_tokens is not None and sampling.spec_tokens.tolist() == [8, 9]
    assert sampling.spec_probs is not None
    np.testing.assert_array_equal(sampling.spec_probs, np.stack(q))
    # Drafts without q (n-gram, greedy drafts): nothing extra.
    drafted.spec_draft_probs = None
    assert build_batch(out, {"a": plain, "b": drafted}, block_size=16).sampling.spec_rows is None  # type: ignore[union-attr]


def test_take_keeps_q_with_its_rows() -> None:
    params = SamplingParams(temperature=1.0)
    q = np.arange(12, dtype=np.float32).reshape(3, 4)
    inputs = build_sampling_inputs([(params, [1], 1)] * 5, [(1, 7, q[0]), (3, 8, q[1]), (4, 9, q[2])])
    taken = inputs.take([0, 3, 4])
    assert taken.spec_rows is not None and taken.spec_rows.tolist() == [1, 2]
    assert taken.spec_tokens is not None and taken.spec_tokens.tolist() == [8, 9]
    assert taken.spec_probs is not None
    np.testing.assert_array_equal(taken.spec_probs, q[1:])
    assert inputs.take([0, 2]).spec_rows is None
