"""LFM2 (short conv + GQA attention) on the MLX runner (CPU device, float32) against transformers, tiny
random weights: the torch suite's checks (tests/backends/test_lfm2.py) on MLX - prompt logits, chunked
prefill == one shot, ragged batched decode with a preemption == greedy generate; LFM2-MoE's logits and
greedy decode."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM  # noqa: E402

from localchat.backends import RunnerOptions  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_lfm2 import PROMPT, TINY_MOE, tiny_lfm2  # noqa: E402
from tests.backends.test_qwen3_next import HybridDriver  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx
TOL = 2e-3  # the torch suite's bound


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return tiny_lfm2()


@pytest.fixture(scope="module")
def runner(hf) -> MLXRunner:  # type: ignore[no-untyped-def]
    r = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    r.initialize_state_cache(4)
    return r


def reference(hf, tokens: list[int]) -> np.ndarray:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float().numpy()


def test_prompt_logits_match_transformers(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the attention layers
    spec = runner.state_cache_spec
    # two conv layers, each a window of 2 inputs x 64 channels (float32 here)
    assert spec is not None and spec.num_layers == 2 and spec.bytes_per_slot == 2 * 2 * 64 * 4
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(np.array(logits) - reference(hf, PROMPT)).max() < TOL


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    rows = []
    for size in (5, 1, 1, 13, 20):  # one-token chunks take the decode path mid-prompt
        _, logits = driver.step_logits({"a": size}, every_token=True)
        rows.append(np.array(logits))
    assert np.abs(np.concatenate(rows) - reference(hf, PROMPT)).max() < TOL


def test_ragged_batched_decode_with_a_preemption_matches_generate(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    steps = 8
    expected = {}
    for req_id, prompt in prompts.items():
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False)
        expected[req_id] = out[0, len(prompt) :].tolist()
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    for req_id, prompt in prompts.items():
        driver.add(req_id, prompt)
    for step in range(steps):
        if step == 4:
            driver.preempt("b")  # comes back as a 44-token prefill next to two decode rows
        driver.step()
    for req_id, prompt in prompts.items():
        assert driver.tokens(req_id)[len(prompt) :] == expected[req_id], req_id


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
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(np.array(logits) - reference(hf, PROMPT)).max() < TOL
    prompts = {"b": PROMPT[:9], "c": PROMPT[30:33]}
    expected = {}
    for req_id, prompt in prompts.items():
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
        expected[req_id] = out[0, len(prompt) :].tolist()
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    for req_id, prompt in prompts.items():
        driver.add(req_id, prompt)
    for _ in range(6):
        driver.step()
    for req_id, prompt in prompts.items():
        assert driver.tokens(req_id)[len(prompt) :] == expected[req_id], req_id
