"""The grammar bitmask and logit_bias in both samplers: one semantics (bias added, then forbidden tokens
at -inf, before penalties and temperature), checked against the numpy reference and against each other;
logprobs stay those of the raw logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends.torch.sampler import SampleResult, new_generator, sample
from localchat.engine.constraint import unpack_bitmask
from localchat.engine.sampling_inputs import SamplingInputs
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.sampling import Row, inputs_for

CPU = torch.device("cpu")
VOCAB = 70  # not a multiple of 32: the last word is partial


def random_bitmask(rows: int, seed: int = 0) -> np.ndarray:
    return (
        np.random.default_rng(seed).integers(-(2**31), 2**31, size=(rows, 3), dtype=np.int64).astype(np.int32)
    )


def random_logits(rows: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, VOCAB)) * 3).astype(np.float32)


def torch_states(*params: SamplingParams) -> list[Row]:
    return [Row(p, [1, 2], []) for p in params]


def inputs(rows: list[Row], bitmask: np.ndarray | None = None) -> SamplingInputs:
    return inputs_for(rows, bitmask)


def Sampler(device: torch.device, seed: int):  # type: ignore[no-untyped-def]
    """The torch runner's side: one generator for unseeded rows."""
    generator = new_generator(device, seed)

    def run(logits: torch.Tensor, rows: list[Row], bitmask: np.ndarray | None = None) -> SampleResult:
        return sample(logits, inputs(rows, bitmask), generator)

    return run


def reference_greedy(
    logits: np.ndarray, bitmask: np.ndarray, biases: list[dict[int, float] | None]
) -> list[int]:
    adjusted = logits.copy()
    for row, bias in enumerate(biases):
        for token, value in (bias or {}).items():
            adjusted[row, token] += value if value > -100 else -np.inf
    adjusted[~unpack_bitmask(bitmask, VOCAB)] = -np.inf
    return adjusted.argmax(-1).tolist()


def test_torch_greedy_follows_the_mask_and_bias_and_keeps_raw_logprobs() -> None:
    logits, bitmask = random_logits(6), random_bitmask(6)
    bitmask[3] = -1  # an unconstrained row in a constrained batch
    biases = [None, {5: 50.0}, {int(logits[2].argmax()): -100.0}, None, {0: 100.0, 1: -3.0}, None]
    params = [SamplingParams(temperature=0, logit_bias=b, logprobs=2) for b in biases]
    result = Sampler(CPU, 0)(torch.from_numpy(logits), torch_states(*params), bitmask)
    assert result.token_ids == reference_greedy(logits, bitmask, biases)
    raw = torch.log_softmax(torch.from_numpy(logits), -1)
    assert result.logprobs is not None
    for row, lp in enumerate(result.logprobs):
        assert lp is not None and lp.logprob == pytest.approx(float(raw[row, lp.token_id]), abs=1e-5)


def test_torch_sampled_tokens_are_always_allowed() -> None:
    logits = random_logits(8, seed=3)
    bitmask = np.zeros((8, 3), dtype=np.int32)
    bitmask[:, 1] = 0b1011  # tokens 32, 33, 35 only
    params = [SamplingParams(temperature=1.5, top_k=50, repetition_penalty=1.2, seed=i) for i in range(8)]
    for _ in range(20):
        tokens = Sampler(CPU, 0)(torch.from_numpy(logits), torch_states(*params), bitmask).token_ids
        assert set(tokens) <= {32, 33, 35}


def test_logit_bias_minus_100_bans_and_plus_100_forces() -> None:
    logits = random_logits(2, seed=5)
    top = int(logits[0].argmax())
    params = [
        SamplingParams(temperature=1.0, logit_bias={top: -100.0}),
        SamplingParams(logit_bias={7: 100.0}),
    ]
    for seed in range(20):
        tokens = Sampler(CPU, seed)(torch.from_numpy(logits), torch_states(*params)).token_ids
        assert tokens[0] != top and tokens[1] == 7


def test_logit_bias_out_of_range_is_refused() -> None:
    from localchat.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="logit_bias"):
        SamplingParams(logit_bias={3: 101.0})


@pytest.mark.mlx
def test_mlx_applies_the_same_mask_and_bias() -> None:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.sampler import _constrain as mlx_constrain
    from localchat.backends.mlx.sampler import new_key
    from localchat.backends.mlx.sampler import sample as mlx_sample
    from localchat.backends.torch.sampler import _constrain as torch_constrain

    logits, bitmask = random_logits(5, seed=7), random_bitmask(5, seed=7)
    bitmask[1] = -1
    biases = [None, {5: 50.0}, {int(logits[2].argmax()): -100.0}, {0: 2.5, 69: -100.0}, None]
    params = [SamplingParams(temperature=0, logit_bias=b) for b in biases]
    step = inputs(torch_states(*params), bitmask)
    ours = np.array(mlx_constrain(mx.array(logits), step))
    theirs = torch_constrain(torch.from_numpy(logits), step).numpy()
    np.testing.assert_array_equal(ours, theirs)
    tokens = mlx_sample(mx.array(logits), step, new_key(0))[0].token_ids
    assert tokens == reference_greedy(logits, bitmask, biases)
