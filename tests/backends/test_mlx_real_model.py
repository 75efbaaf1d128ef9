"""The real model (SmolLM2-135M-Instruct GGUF Q4_1): the torch and MLX runners give the same greedy
tokens for three chat prompts, 48 tokens each.

Both compute in float32 on the same weights, but torch dequantizes them and runs dense matmuls while
MLX keeps Q4_1/Q8_0 quantized (`mx.quantized_matmul`): summation orders differ, so a near-tie between
the top two logits could flip. On a mismatch the failure names the first differing token and the
top-2 logit margins of both runners there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("torch")

from localchat.backends import RunnerOptions, create_runner
from localchat.weights.loader import load_model
from tests.helpers.real_model import PROMPTS, chat_prompts, greedy, top2
from tests.helpers.torch_models import exact_weights

pytestmark = [pytest.mark.mlx, pytest.mark.slow]


def test_torch_and_mlx_agree_on_greedy_tokens(smollm2_gguf: Path) -> None:
    bundle = load_model(smollm2_gguf)
    tokenizer = bundle.tokenizer
    prompts = chat_prompts(bundle)
    options = RunnerOptions(device="cpu", dtype="float32")
    with exact_weights():  # torch's dequantized reference path (fp32 `auto` would use the CPU kernels)
        runners = {name: create_runner(name, bundle, options) for name in ("torch", "mlx")}
    outputs = {name: greedy(runner, bundle, prompts) for name, runner in runners.items()}
    problems = []
    for prompt, ours, theirs in zip(prompts, outputs["mlx"], outputs["torch"], strict=True):
        if ours == theirs:
            continue
        at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        context = prompt + theirs[:at]
        margins = {name: top2(runner, context) for name, runner in runners.items()}
        problems.append(
            f"prompt {tokenizer.decode(prompt)!r}: first difference at output token {at}: {margins}"
        )
    assert not problems, "\n".join(problems)
    assert len({tuple(o) for o in outputs["mlx"]}) == len(PROMPTS)
    assert "Paris" in tokenizer.decode(outputs["mlx"][0])
