"""Granite 4.0-H (Mamba-2 and RoPE attention, each followed by the shared SwiGLU MLP plus a top-k MoE, with
its embedding / residual / logit multipliers) on the MLX runner (CPU device, float32) against transformers,
tiny random weights: the torch suite's checks (tests/backends/test_granitemoehybrid.py) on MLX - prompt
logits over two SSD chunks, chunked prefill == one shot, ragged batched decode with a preemption == greedy
generate."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends import RunnerOptions  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_granitemoehybrid import PROMPT, TOL, tiny_granite  # noqa: E402
from tests.backends.test_qwen3_next import HybridDriver  # noqa: E402
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


def reference(hf, tokens: list[int]) -> np.ndarray:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float().numpy()


def test_prompt_logits_match_transformers(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the attention layers
    spec = runner.state_cache_spec
    assert spec is not None and spec.num_layers == 2
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(np.array(logits) - reference(hf, PROMPT)).max() < TOL


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(hf, runner: MLXRunner) -> None:  # type: ignore[no-untyped-def]
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    rows = []
    for size in (5, 1, 29, 35):  # a one-token chunk takes the decode path mid-prompt
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
            driver.preempt("b")  # comes back as a 74-token prefill next to two decode rows
        driver.step()
    for req_id, prompt in prompts.items():
        assert driver.tokens(req_id)[len(prompt) :] == expected[req_id], req_id
