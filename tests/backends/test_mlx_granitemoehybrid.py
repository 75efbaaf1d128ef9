"""Granite 4.0-H (Mamba-2 and RoPE attention, each followed by the shared SwiGLU MLP plus a top-k MoE, with
its embedding / residual / logit multipliers) on the MLX runner (CPU device, float32) against transformers,
tiny random weights: the torch suite's checks (tests/backends/test_granitemoehybrid.py) on MLX - prompt
logits over two SSD chunks, chunked prefill == one shot, ragged batched decode with a preemption == greedy
generate."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends import RunnerOptions  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_granitemoehybrid import PROMPT, TOL, tiny_granite  # noqa: E402
from tests.helpers.hybrid_parity import assert_decode_matches_generate, assert_prefill_matches  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return tiny_granite()


@pytest.fixture(scope="module")
def runner(hf) -> MLXRunner:  # type: ignore[no-untyped-def]
    r = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    r.initialize_state_cache(4)
    return r


def test_prompt_logits_match_transformers(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the attention layers
    spec = runner.state_cache_spec
    assert spec is not None and spec.num_layers == 2
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL)


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    chunks = (5, 1, 29, 35)  # a one-token chunk takes the decode path mid-prompt
    assert_prefill_matches(hf, runner, PROMPT, chunks, tol=TOL)


def test_ragged_batched_decode_with_a_preemption_matches_generate(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    # "b" comes back as a 74-token prefill next to two decode rows
    assert_decode_matches_generate(hf, runner, prompts, 8, preempt=("b", 4))
