"""LFM2 (short conv + GQA attention) on the MLX runner (CPU device, float32) against transformers, tiny
random weights: the torch suite's checks (tests/backends/test_lfm2.py) on MLX - prompt logits, chunked
prefill == one shot, ragged batched decode with a preemption == greedy generate; LFM2-MoE's logits and
greedy decode."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM  # noqa: E402

from localchat.backends import RunnerOptions  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_lfm2 import PROMPT, TINY_MOE, TOL, tiny_lfm2  # noqa: E402
from tests.helpers.hybrid_parity import assert_decode_matches_generate, assert_prefill_matches  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return tiny_lfm2()


@pytest.fixture(scope="module")
def runner(hf) -> MLXRunner:  # type: ignore[no-untyped-def]
    r = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    r.initialize_state_cache(4)
    return r


def test_prompt_logits_match_transformers(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the attention layers
    spec = runner.state_cache_spec
    # two conv layers, each a window of 2 inputs x 64 channels (float32 here)
    assert spec is not None and spec.num_layers == 2 and spec.bytes_per_slot == 2 * 2 * 64 * 4
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL)


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    chunks = (5, 1, 1, 13, 20)  # one-token chunks take the decode path mid-prompt
    assert_prefill_matches(hf, runner, PROMPT, chunks, tol=TOL)


def test_ragged_batched_decode_with_a_preemption_matches_generate(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    # "b" comes back as a 44-token prefill next to two decode rows
    assert_decode_matches_generate(hf, runner, prompts, 8, preempt=("b", 4))


def test_lfm2_moe_matches_transformers() -> None:
    """LFM2-MoE: layer 0 dense, then sigmoid-routed experts whose (randomised) bias steers the choice."""
    torch.manual_seed(0)
    hf = Lfm2MoeForCausalLM(Lfm2MoeConfig(**TINY_MOE)).float().eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(base + 0.25 * torch.randn_like(param))
        for name, buffer in hf.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(0.3 * torch.randn_like(buffer))
    runner = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    runner.initialize_state_cache(4)
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL)
    assert_decode_matches_generate(hf, runner, {"b": PROMPT[:9], "c": PROMPT[30:33]}, 6)
