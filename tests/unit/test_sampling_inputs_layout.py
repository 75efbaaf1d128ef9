"""build_sampling_inputs packs fields of one kind into one array: each field must still be its own
contiguous [N] array of the documented dtype with the params' values, for any N (0 included)."""

from __future__ import annotations

import numpy as np
import pytest

from localchat.engine.sampling_inputs import build_sampling_inputs
from localchat.engine.sampling_params import SamplingParams

FIELDS = {
    "temperature": np.float32, "top_k": np.int32, "top_p": np.float32, "min_p": np.float32,
    "presence_penalty": np.float32, "frequency_penalty": np.float32, "repetition_penalty": np.float32,
    "seed": np.uint64, "has_seed": np.bool_, "token_index": np.int64, "num_logprobs": np.int32,
    "penalty_indptr": np.int64, "prompt_len": np.int64, "bias_indptr": np.int64,
}  # fmt: skip


def _params(i: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.1 * i, top_k=i, top_p=1 - 0.05 * i, min_p=0.01 * i, presence_penalty=0.2 * (i % 2),
        frequency_penalty=0.3 * (i % 3 == 1), repetition_penalty=1 + 0.1 * (i % 2),
        logprobs=None if i % 2 else i, seed=None if i % 3 else 7 * i,
    )  # fmt: skip


@pytest.mark.parametrize("n", [0, 1, 3])
def test_each_field_is_a_contiguous_array_of_its_own(n: int) -> None:
    params = [_params(i) for i in range(n)]
    built = build_sampling_inputs([(p, list(range(5 + i)), 2) for i, p in enumerate(params)])
    for name, dtype in FIELDS.items():
        array = getattr(built, name)
        size = n + 1 if name.endswith("indptr") else n
        assert array.dtype == dtype and array.shape == (size,) and array.flags.c_contiguous, name
    expected = {
        "temperature": [p.temperature for p in params], "top_p": [p.top_p for p in params],
        "min_p": [p.min_p for p in params], "presence_penalty": [p.presence_penalty for p in params],
        "frequency_penalty": [p.frequency_penalty for p in params],
        "repetition_penalty": [p.repetition_penalty for p in params],
    }  # fmt: skip
    for name, values in expected.items():
        assert np.array_equal(getattr(built, name), np.array(values, dtype=np.float32)), name
    assert built.top_k.tolist() == [p.top_k for p in params]
    assert built.num_logprobs.tolist() == [-1 if p.logprobs is None else p.logprobs for p in params]
    built.temperature[...] = 5.0  # a field written in place leaves the others alone
    assert not (built.top_p == 5.0).any() and not (built.min_p == 5.0).any()
