"""The greedy fast path (sampler.greedy_tokens): the same token as `logits.float().argmax(-1)` for every
float the LM head can produce, ties, signed zeros, infinities and NaNs included."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import torch

from localchat.backends.torch import sampler
from localchat.backends.torch.sampler import greedy_tokens, new_generator, sample
from localchat.kernels import library as c_library
from tests.helpers.sampling import inputs_for, row

CPU = torch.device("cpu")


def _cases(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    plain = 4 * torch.randn(4, 1000, generator=g)
    negative = -plain.abs() - 0.5  # every logit negative: the flipped-magnitude order decides
    tied = plain.clone()
    tied[:, 7] = tied[:, 900] = tied.max() + 1  # two equal maxima: the first wins
    zeros = torch.zeros(3, 50)
    zeros[0, 3] = -0.0  # -0.0 == +0.0: index 0 still wins
    zeros[1, :10] = -0.0
    zeros[1, 20] = 0.0
    zeros[2] = -1.0
    zeros[2, 30] = -0.0
    infs = plain.clone()
    infs[0, 5] = float("inf")
    infs[1] = float("-inf")
    infs[2, 9] = float("-inf")
    tiny = torch.full((2, 64), -1e-39)  # subnormals (float32) / the smallest magnitudes (bfloat16)
    tiny[1, 40] = 1e-39
    return [t.to(dtype).contiguous() for t in (plain, negative, tied, zeros, infs, tiny)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_tokens_equal_torch_argmax(dtype: torch.dtype) -> None:
    for logits in _cases(dtype):
        assert greedy_tokens(logits) == logits.float().argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_nan_leaves_the_row_to_torch(dtype: torch.dtype) -> None:
    logits = torch.randn(2, 100).to(dtype)
    logits[1, 50] = float("nan")
    assert greedy_tokens(logits) is None
    negative = torch.randn(2, 100).to(dtype)
    # A NaN with the sign bit set (0xFFC0 / 0xFFC00000): the largest unsigned patterns.
    negative.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[0, 7] = (
        -64 if dtype == torch.bfloat16 else -4194304
    )
    assert negative[0, 7].isnan() and greedy_tokens(negative) is None
    result = sample(logits, inputs_for([row(temperature=0.0), row(temperature=0.0)]), new_generator(CPU, 0))
    assert result.token_ids == logits.float().argmax(dim=-1).tolist()


def test_only_plain_greedy_rows_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = sampler.greedy_tokens

    def counted(logits: torch.Tensor) -> list[int] | None:
        calls.append(1)
        return real(logits)

    monkeypatch.setattr(sampler, "greedy_tokens", counted)
    logits = torch.randn(2, 100).to(torch.bfloat16)
    generator = new_generator(CPU, 0)
    greedy = sample(logits, inputs_for([row(temperature=0.0)] * 2), generator)
    assert calls == [1] and greedy.token_ids == logits.float().argmax(-1).tolist()
    others: tuple[dict[str, Any], ...] = (
        {"logprobs": 2},
        {"repetition_penalty": 1.3},
        {"logit_bias": {3: 5.0}},
        {"temperature": 0.7},
    )
    for params in others:
        sample(logits, inputs_for([row(temperature=0.0), row(**{"temperature": 0.0, **params})]), generator)
    assert calls == [1]


def test_off_the_fast_path_for_other_dtypes() -> None:
    assert greedy_tokens(torch.randn(2, 10, dtype=torch.float16)) is None
    assert greedy_tokens(torch.randn(10, 2).t()) is None  # not contiguous


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_row_steps_equal_torch_argmax(dtype: torch.dtype) -> None:
    """A one-row step (one stream) takes scalar checks instead of the array ones: the same token for
    every case row by row (negative, zero and tied maxima included), None for a row with a NaN."""
    for logits in _cases(dtype):
        for i in range(logits.shape[0]):
            one = logits[i : i + 1].contiguous()
            assert greedy_tokens(one) == one.float().argmax(dim=-1).tolist()
    ints = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for nan in (float("nan"), None):
        logits = torch.randn(1, 100).to(dtype)
        if nan is None:  # the sign bit set: a negative NaN, the largest unsigned pattern
            logits.view(ints)[0, 7] = -64 if dtype == torch.bfloat16 else -4194304
        else:
            logits[0, 50] = nan
        assert logits.isnan().any() and greedy_tokens(logits) is None


@pytest.mark.skipif(c_library.optional("lc_argmax_rows") is None, reason="kernels not built")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_compiled_pass_gives_torch_argmax(dtype: torch.dtype) -> None:
    """csrc/lc_argmax.h over chunk edges (a maximum in the last element, ties across chunks): each row's
    torch argmax, -1 for a row whose maximum is not positive; greedy_tokens answers every row."""
    one_pass = c_library.optional("lc_argmax_rows")
    assert one_pass is not None
    g = torch.Generator().manual_seed(1)
    for cols in (1, 7, 511, 512, 513, 1025, 151936):
        logits = 4 * torch.randn(4, cols, generator=g)
        logits[1, -1] = 50.0
        logits[2, cols // 2] = logits[2, -1] = 60.0
        logits[3] = -logits[3].abs() - 1
        logits = logits.to(dtype)
        found = (ctypes.c_int64 * 4)()
        assert one_pass(logits.data_ptr(), 8 * logits.element_size(), 4, cols, found) == 0
        want = logits.float().argmax(dim=-1).tolist()
        assert list(found) == [*want[:3], -1], cols
        assert greedy_tokens(logits) == want
