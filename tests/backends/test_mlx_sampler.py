"""The MLX sampler: the torch sampler's semantics (checked against it where both are deterministic),
seeded rows reproducible whatever shares the batch and across preemption, draws that follow the
filtered distribution, and logprobs of the raw distribution."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from localchat.backends.mlx.sampler import (  # noqa: E402
    SampleResult,
    _apply_penalties,
    _top_k,
    _top_p,
    new_key,
    sample,
)
from localchat.engine.sampling_params import SamplingParams  # noqa: E402
from tests.helpers.sampling import Row, inputs_for  # noqa: E402

pytestmark = pytest.mark.mlx

VOCAB = 64


def states(
    *params: SamplingParams, prompt: list[int] | None = None, output: list[int] | None = None
) -> list[Row]:
    return [Row(p, list(prompt or [1, 2, 3]), list(output or [])) for p in params]


class Sampler:
    """The engine and runner around `sample`: the runner's shared key, and each sampled token appended
    to its request (the next step's penalties and seeded draws see it)."""

    def __init__(self, seed: int) -> None:
        self.key = new_key(seed)

    def __call__(self, logits: mx.array, rows: list[Row]) -> SampleResult:
        result, self.key = sample(logits, inputs_for(rows), self.key)
        for row, token in zip(rows, result.token_ids, strict=True):
            row.output.append(token)
        return result


def random_logits(rows: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, VOCAB)) * 3).astype(np.float32)


def test_greedy_is_argmax_and_top_k_1_is_greedy() -> None:
    logits = random_logits(3)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=2.0, top_k=1)]
    result = Sampler(0)(mx.array(logits[:2]), states(*params))
    assert result.token_ids == logits[:2].argmax(-1).tolist()
    assert result.logprobs is None


def test_filters_match_the_torch_sampler() -> None:
    torch = pytest.importorskip("torch")
    from localchat.backends.torch import sampler as torch_sampler

    logits = random_logits(4, seed=1)
    ks, ps = [0, 1, 5, 63], [1.0, 0.5, 0.9, 0.05]
    ours = np.array(_top_p(_top_k(mx.array(logits), ks), ps))
    theirs = torch_sampler._top_p(torch_sampler._top_k(torch.from_numpy(logits), ks), ps).numpy()
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    np.testing.assert_array_equal(ours[~np.isinf(ours)], theirs[~np.isinf(theirs)])

    params = [
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25),
        SamplingParams(),
        SamplingParams(repetition_penalty=0.8, presence_penalty=-1.0),
    ]
    prompt, output = [4, 5, 6, 4], [7, 7, 8, 5]
    step = inputs_for([Row(p, prompt, output) for p in params])
    ours = np.array(_apply_penalties(mx.array(logits[:3]), np.array([0, 2]), step))
    theirs = torch_sampler._apply_penalties(torch.from_numpy(logits[:3]).clone(), np.array([0, 2]), step)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)
    assert not np.array_equal(ours[0], logits[0])  # the penalties did something


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    seeded = SamplingParams(temperature=1.0, seed=1234)
    logits = random_logits(3, seed=2)

    def run(batch_rows: list[SamplingParams], row: int, sampler_seed: int = 0) -> list[int]:
        """The seeded request sits at `row` and always sees logits[1]."""
        sampler = Sampler(sampler_seed)
        st = states(*batch_rows)
        batch = np.stack([logits[1] if i == row else logits[i] for i in range(len(batch_rows))])
        return [sampler(mx.array(batch), st).token_ids[row] for _ in range(6)]

    alone = run([seeded], 0)
    crowded = run(
        [SamplingParams(temperature=1.0), seeded, SamplingParams(temperature=0.0)], 1, sampler_seed=9
    )
    assert alone == crowded
    assert len(set(alone)) > 1  # really sampling, not a constant
    assert run([SamplingParams(temperature=1.0, seed=99)], 0) != alone


def test_seeded_request_resumes_its_stream_after_preemption() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    logits = mx.array(random_logits(1, seed=3))
    sampler = Sampler(0)
    state = states(params)
    uninterrupted = [sampler(logits, state).token_ids[0] for _ in range(6)]
    # Preempted after 3 tokens: the engine sends the prompt and those tokens again.
    resumed = states(params, output=uninterrupted[:3])
    assert [sampler(logits, resumed).token_ids[0] for _ in range(3)] == uninterrupted[3:]


def test_draws_follow_the_filtered_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05] + [1e-9] * (VOCAB - 4), dtype=np.float32))
    n = 4000
    batch = mx.array(np.tile(logits, (n, 1)))
    plain = Sampler(0)(batch, states(*[SamplingParams(temperature=1.0)] * n)).token_ids
    freq = np.bincount(plain, minlength=VOCAB) / n
    np.testing.assert_allclose(freq[:4], [0.5, 0.3, 0.15, 0.05], atol=0.03)
    # top_p 0.7 keeps {0, 1} (mass before token 1 is 0.5 < 0.7); min_p 0.4 keeps tokens >= 0.2.
    top_p = Sampler(1)(batch, states(*[SamplingParams(temperature=1.0, top_p=0.7)] * n)).token_ids
    assert set(top_p) == {0, 1} and abs(np.mean(np.array(top_p) == 0) - 0.5 / 0.8) < 0.03
    min_p = Sampler(2)(batch, states(*[SamplingParams(temperature=1.0, min_p=0.4)] * n)).token_ids
    assert set(min_p) == {0, 1}
    top_k = Sampler(3)(batch, states(*[SamplingParams(temperature=1.0, top_k=3)] * n)).token_ids
    assert set(top_k) == {0, 1, 2}


def test_penalties_change_greedy_choice_and_track_output() -> None:
    logits = np.zeros((1, VOCAB), dtype=np.float32)
    logits[0, 10], logits[0, 11] = 2.0, 1.9
    params = SamplingParams(temperature=0.0, presence_penalty=1.0)
    sampler, st = Sampler(0), states(params, prompt=[1])
    first = sampler(mx.array(logits), st).token_ids[0]
    second = sampler(mx.array(logits), st).token_ids[0]  # 10 was output once: 2.0 - 1.0 < 1.9
    assert (first, second) == (10, 11)


def test_logprobs_are_of_the_raw_distribution() -> None:
    logits = random_logits(2, seed=4)
    params = [
        SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=2.0),
        SamplingParams(temperature=0.0),
    ]
    result = Sampler(0)(mx.array(logits), states(*params, prompt=list(range(VOCAB))))
    assert result.logprobs is not None and result.logprobs[1] is None
    lp = result.logprobs[0]
    assert lp is not None
    reference = logits[0] - np.log(np.exp(logits[0].astype(np.float64)).sum())
    assert lp.token_id == result.token_ids[0]
    assert lp.logprob == pytest.approx(reference[lp.token_id], abs=1e-5)
    top_ids = np.argsort(-reference)[:3].tolist()
    assert [t for t, _ in lp.top] == top_ids
    np.testing.assert_allclose([v for _, v in lp.top], reference[top_ids], atol=1e-5)
