"""Qwen3.5 (gated DeltaNet + gated full attention) on the MLX runner (CPU device, float32) against
transformers, tiny random weights: the torch suite's checks (tests/backends/test_qwen3_next.py) on MLX -
prompt logits over two DeltaNet chunks, chunked prefill == one shot, ragged batched decode with a
preemption == greedy generate, and the two kernel forms agree."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends import RunnerOptions  # noqa: E402
from localchat.backends.mlx.gated_deltanet import delta_rule_chunked, delta_rule_step  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_qwen3_next import MEAN_TOL, PROMPT, TOL, tiny_qwen3_5  # noqa: E402
from tests.helpers.hybrid_parity import assert_decode_matches_generate, assert_prefill_matches  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return tiny_qwen3_5()


@pytest.fixture(scope="module")
def runner(hf) -> MLXRunner:  # type: ignore[no-untyped-def]
    r = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    r.initialize_state_cache(4)
    return r


def test_prompt_logits_match_transformers(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the full-attention layers
    spec = runner.state_cache_spec
    # conv window 3 x (2*32 + 32) float32 + recurrent 4 x 16 x 8 float32, per linear layer
    assert (
        spec is not None and spec.num_layers == 2 and spec.bytes_per_slot == 2 * (3 * 96 * 4 + 4 * 16 * 8 * 4)
    )
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL, mean_tol=MEAN_TOL)


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    chunks = (5, 1, 30, 34)  # a one-token chunk takes the decode path mid-prompt
    assert_prefill_matches(hf, runner, PROMPT, chunks, tol=TOL, mean_tol=MEAN_TOL)


def test_ragged_batched_decode_with_a_preemption_matches_generate(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    # "b" comes back as a 74-token prefill next to two decode rows
    assert_decode_matches_generate(hf, runner, prompts, 8, preempt=("b", 4))


def test_recurrent_form_equals_chunked_form() -> None:
    rng = np.random.default_rng(0)
    length, heads, dk, dv = 37, 3, 8, 5

    def unit(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q, k = mx.array(unit((length, heads, dk)) * dk**-0.5), mx.array(unit((length, heads, dk)))
    v = mx.array(rng.standard_normal((length, heads, dv)).astype(np.float32))
    g = mx.array(-rng.random((length, heads)).astype(np.float32))
    beta = mx.array(rng.random((length, heads)).astype(np.float32))
    state = mx.array(rng.standard_normal((heads, dk, dv)).astype(np.float32))
    chunked, final = delta_rule_chunked(q, k, v, g, beta, state, chunk=16)
    s, steps = state[None], []
    for t in range(length):
        o, s = delta_rule_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s)
        steps.append(o)
    assert mx.allclose(chunked, mx.concatenate(steps), atol=1e-5).item()
    assert mx.allclose(final, s[0], atol=1e-5).item()
