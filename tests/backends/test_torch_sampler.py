"""The batched sampler: greedy, truncation masks, penalties, seeded reproducibility, logprobs."""

from __future__ import annotations

import numpy as np
import torch

from localchat.backends.torch.sampler import (
    SampleResult,
    _apply_penalties,
    _top_k,
    _top_p,
    new_generator,
    sample,
)
from tests.helpers.sampling import Row, inputs_for
from tests.helpers.sampling import row as state

CPU = torch.device("cpu")
VOCAB = 32


class Sampler:
    """The runner's side of sampling: one generator for unseeded rows, nothing per request."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.generator = new_generator(device, seed)

    def __call__(self, logits: torch.Tensor, rows: list[Row]) -> SampleResult:
        return sample(logits, inputs_for(rows), self.generator)


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return 3 * torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_argmax() -> None:
    logits = random_logits(5)
    result = Sampler(CPU, 0)(logits, [state(temperature=0.0) for _ in range(5)])
    assert result.token_ids == logits.argmax(-1).tolist()
    assert result.logprobs is None


def test_top_k_one_is_greedy_whatever_the_temperature() -> None:
    logits = random_logits(6, seed=1)
    result = Sampler(CPU, 0)(logits, [state(temperature=1.5, top_k=1) for _ in range(6)])
    assert result.token_ids == logits.argmax(-1).tolist()


def test_top_k_mask_keeps_k_best_per_row() -> None:
    logits = random_logits(3, seed=2)
    masked = _top_k(logits.clone(), [2, 0, 5])
    kept = torch.isfinite(masked)
    assert kept.sum(-1).tolist() == [2, VOCAB, 5]
    assert kept[0, logits[0].topk(2).indices].all() and kept[2, logits[2].topk(5).indices].all()


def test_top_p_mask_keeps_smallest_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5], [0.25] * 4]))
    masked = _top_p(logits.clone(), [0.7, 0.8, 0.1])
    assert torch.isfinite(masked).tolist() == [
        [True, True, False, False],  # 0.5 < 0.7, then 0.8 >= 0.7: two tokens
        [False, False, True, True],
        [True, False, False, False],  # ties: still at least one token
    ]


def test_min_p_never_samples_below_threshold() -> None:
    probs = torch.tensor([0.5, 0.3, 0.12, 0.08] + [0.0] * (VOCAB - 4))
    logits = torch.log(probs).expand(400, VOCAB).clone()
    tokens = Sampler(CPU, 3)(logits, [state(temperature=1.0, min_p=0.2) for _ in range(400)]).token_ids
    assert set(tokens) == {0, 1, 2}  # 0.08 < 0.2 * 0.5


def test_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125] + [0.0] * (VOCAB - 4))
    n = 8000
    logits = torch.log(probs).expand(n, VOCAB).clone()
    tokens = torch.tensor(Sampler(CPU, 4)(logits, [state(temperature=1.0) for _ in range(n)]).token_ids)
    freq = torch.bincount(tokens, minlength=VOCAB).float() / n
    assert (freq - probs).abs().max() < 0.03


def test_temperature_sharpens() -> None:
    probs = torch.tensor([0.6, 0.4] + [0.0] * (VOCAB - 2))
    logits = torch.log(probs).expand(4000, VOCAB).clone()
    tokens = torch.tensor(Sampler(CPU, 5)(logits, [state(temperature=0.25) for _ in range(4000)]).token_ids)
    # p0 ∝ 0.6^4 / (0.6^4 + 0.4^4) = 0.835
    assert abs((tokens == 0).float().mean().item() - 0.835) < 0.03


def test_penalties_match_hand_computation() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0] + [0.0] * (VOCAB - 4)])
    st = state(
        prompt=[0, 1], output=[2, 2, 3], repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25
    )
    out = _apply_penalties(logits.clone(), np.array([0]), inputs_for([st]))[0]
    # token 0 (prompt, positive): 2/2; token 1 (prompt, negative): -1*2;
    # token 2 (output x2): 0.5/2 - 2*0.5 - 0.25; token 3 (output x1): 3/2 - 0.5 - 0.25; others untouched.
    expected = torch.tensor([1.0, -2.0, 0.25 - 1.0 - 0.25, 1.5 - 0.5 - 0.25] + [0.0] * (VOCAB - 4))
    torch.testing.assert_close(out, expected)


def test_penalties_follow_sampled_tokens() -> None:
    """The engine's inputs carry each sampled token, so the next step penalizes it."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 7] = 1.0
    st = state(temperature=0.0, presence_penalty=2.0)
    sampler = Sampler(CPU, 0)
    assert sampler(logits, [st]).token_ids == [7]
    st.output.append(7)  # what the engine does with the sampled token
    assert sampler(logits, [st]).token_ids != [7]  # 1.0 - 2.0 now loses to the zeros


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = random_logits(1, seed=6)[0]

    def draws(batch_size: int, row: int) -> list[int]:
        seeded = state(temperature=1.0, seed=1234)
        tokens = []
        sampler = Sampler(CPU, batch_size)  # a different global seed each time, too
        for _ in range(10):
            batch = [state(temperature=0.8, top_p=0.9) for _ in range(batch_size)]
            batch[row] = seeded
            rows = torch.stack([logits if i == row else random_logits(1, i)[0] for i in range(batch_size)])
            tokens.append(sampler(rows, batch).token_ids[row])
            seeded.output.append(tokens[-1])
        return tokens

    alone = draws(1, 0)
    assert draws(4, 2) == alone and draws(7, 6) == alone
    assert len(set(alone)) > 1  # it really samples


def test_a_seeded_request_resumed_after_preemption_draws_what_it_would_have() -> None:
    logits = random_logits(1, seed=9)
    sampler = Sampler(CPU, 0)
    straight = state(temperature=1.0, seed=77)
    for _ in range(8):
        straight.output.append(sampler(logits, [straight]).token_ids[0])
    tokens = straight.output
    # Preempted after 3 tokens: the engine sends the prompt and those outputs again.
    resumed = state(output=tokens[:3], temperature=1.0, seed=77)
    for _ in range(5):
        resumed.output.append(sampler(logits, [resumed]).token_ids[0])
    assert resumed.output == tokens
    assert len(set(tokens)) > 1


def test_top_p_one_keeps_the_tail_when_batched_with_a_nucleus_row() -> None:
    peaked = torch.full((VOCAB,), -10.0)
    peaked[0] = 30.0  # the float cumsum reaches 1.0 right after token 0
    masked = _top_p(torch.stack([peaked, peaked]), [1.0, 0.5])
    assert torch.isfinite(masked[0]).all()  # p = 1: nothing dropped
    assert torch.isfinite(masked[1]).sum() == 1


def test_unseeded_rows_follow_the_runner_seed() -> None:
    logits = random_logits(8, seed=7)

    def run(seed: int) -> list[int]:
        return Sampler(CPU, seed)(logits, [state(temperature=1.0) for _ in range(8)]).token_ids

    assert run(11) == run(11)
    assert any(run(11) != run(s) for s in range(12, 16))


def test_logprobs_are_raw_log_softmax() -> None:
    logits = random_logits(3, seed=8)
    states = [state(temperature=1.0, logprobs=5), state(temperature=0.0), state(temperature=0.0, logprobs=0)]
    result = Sampler(CPU, 0)(logits, states)
    assert result.logprobs is not None and result.logprobs[1] is None
    expected = torch.log_softmax(logits, dim=-1)
    first = result.logprobs[0]
    assert first is not None and first.token_id == result.token_ids[0]
    assert abs(first.logprob - expected[0, first.token_id].item()) < 1e-6
    assert [t for t, _ in first.top] == expected[0].topk(5).indices.tolist()
    values = [lp for _, lp in first.top]
    assert values == sorted(values, reverse=True) and sum(torch.tensor(values).exp()) <= 1.0
    torch.testing.assert_close(torch.tensor(values), expected[0].topk(5).values)
    last = result.logprobs[2]
    assert last is not None and last.top == [] and last.token_id == int(logits[2].argmax())
    assert abs(last.logprob - expected[2].max().item()) < 1e-6


def test_logprobs_ignore_penalties() -> None:
    logits = random_logits(1, seed=9)
    st = state(temperature=0.0, logprobs=1, output=[int(logits[0].argmax())], presence_penalty=2.0)
    result = Sampler(CPU, 0)(logits, [st])
    assert result.logprobs is not None and result.logprobs[0] is not None
    token = result.token_ids[0]
    assert abs(result.logprobs[0].logprob - torch.log_softmax(logits[0], -1)[token].item()) < 1e-6
