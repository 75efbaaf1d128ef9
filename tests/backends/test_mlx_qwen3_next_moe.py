"""Qwen3-Next and Qwen3.5-MoE (the gated DeltaNet hybrid with sparse MoE MLPs and a gated shared expert) on
the MLX runner (CPU device, float32) against transformers, tiny random weights: prompt logits over two
prefill chunks and greedy decode (tests/backends/test_qwen3_next_moe.py on MLX)."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends import RunnerOptions  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_qwen3_next import MEAN_TOL, PROMPT, TOL, HybridDriver  # noqa: E402
from tests.backends.test_qwen3_next_moe import FAMILIES, tiny_model  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_moe_hybrid_logits_and_greedy_decode_match_transformers(model_type: str) -> None:
    hf = tiny_model(model_type)
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].float().numpy()
        generated = hf.generate(torch.tensor([PROMPT[:12]]), max_new_tokens=6, do_sample=False)
    runner = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    runner.initialize_state_cache(2)
    driver = HybridDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    rows = [np.array(driver.step_logits({"a": n}, every_token=True)[1]) for n in (40, 30)]
    err = np.abs(np.concatenate(rows) - ref)
    assert err.max() < TOL and err.mean() < MEAN_TOL, (err.max(), err.mean())
    driver.add("b", PROMPT[:12])
    for _ in range(6):
        driver.step({"b": len(driver.tokens("b")) - driver.reqs["b"].num_computed})
    assert driver.tokens("b")[12:] == generated[0, 12:].tolist()
