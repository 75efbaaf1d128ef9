"""A 2k-token prompt under a 512-token sliding window matches transformers, on both backends: chunked
prefill over paged blocks (chunks cross the window), then decode steps whose window slides.

The parity suites use an 8-token window on short prompts; this checks the same at a realistic scale
(windows over many blocks, a context four windows long)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

ATOL = 1e-4
PROMPT_LEN, WINDOW, CHUNKS, DECODE_STEPS = 2048, 512, (700, 700, 648), 4
LONG = {"sliding_window": WINDOW, "max_position_embeddings": 4096}
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": ("mistral", LONG),
    "gemma2": (
        "gemma2",
        {**LONG, "head_dim": 16, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 2.0},
    ),
}


def run_long_prompt(runner: Any, hf: torch.nn.Module) -> None:
    prompt = np.random.default_rng(0).integers(3, 256, PROMPT_LEN).tolist()
    driver = PagedDriver(runner, num_blocks=160, block_size=16)
    driver.add("a", prompt)
    for chunk in CHUNKS:
        _, logits = driver.step_logits({"a": chunk})
    for _ in range(DECODE_STEPS):
        driver.feed("a", int(np.argmax(np.asarray(logits[-1]))))
        _, logits = driver.step_logits()
    tokens = driver.tokens("a")
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0, -1].float().numpy()
    ours = np.asarray(logits[-1], dtype=np.float32)
    assert np.abs(ours - ref).max() < ATOL
    # The generated tokens are transformers' greedy choices at each position.
    with torch.no_grad():
        every = hf(torch.tensor([tokens])).logits[0].argmax(-1).tolist()
    assert tokens[PROMPT_LEN:] == every[PROMPT_LEN - 1 : -1]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_torch_2k_prompt_with_512_window(name: str) -> None:
    model_type, overrides = MODELS[name]
    hf = tiny_hf_model(model_type, **overrides)
    run_long_prompt(fp32_runner(bundle_from_hf(hf)), hf)


@pytest.mark.slow
@pytest.mark.mlx
@pytest.mark.parametrize("name", list(MODELS))
def test_mlx_2k_prompt_with_512_window(name: str) -> None:
    pytest.importorskip("mlx.core")
    from localchat.backends import RunnerOptions
    from localchat.backends.mlx.runner import MLXRunner

    model_type, overrides = MODELS[name]
    hf = tiny_hf_model(model_type, **overrides)
    runner = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    run_long_prompt(runner, hf)
