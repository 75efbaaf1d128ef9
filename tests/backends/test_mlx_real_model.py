"""The real model (SmolLM2-135M-Instruct GGUF Q4_1): the torch and MLX runners give the same greedy
tokens for three chat prompts, 48 tokens each.

Both compute in float32 on the same weights, but torch dequantizes them and runs dense matmuls while
MLX keeps Q4_1/Q8_0 quantized (`mx.quantized_matmul`): summation orders differ, so a near-tie between
the top two logits could flip. On a mismatch the failure names the first differing token and the
top-2 logit margins of both runners there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("torch")

from backends import RunnerOptions, create_runner
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from localchat.weights.chat_template import ChatTemplate
from localchat.weights.loader import load_model
from tests.helpers.torch_batch import PagedDriver

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion to a child."]
NEW_TOKENS = 48


def greedy(runner: object, bundle: ModelBundle, prompts: list[list[int]]) -> list[list[int]]:
    engine = LLMEngine(
        runner,  # type: ignore[arg-type]
        bundle.tokenizer,
        EngineConfig(kv_cache_mib=64),
        eos_token_ids=bundle.config.eos_token_ids,
        model_max_len=bundle.config.max_position_embeddings,
    )
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    out: dict[str, list[int]] = {i: [] for i in ids}
    while engine.has_unfinished:
        for o in engine.step():
            out[o.req_id].extend(o.new_token_ids)
    return [out[i] for i in ids]


def margin(runner: object, tokens: list[int]) -> tuple[int, int, float]:
    """(top-1 id, top-2 id, their logit gap) for the token after `tokens`."""
    driver = PagedDriver(runner, num_blocks=64, block_size=16)  # type: ignore[arg-type]
    driver.add("m", tokens)
    _, logits = driver.step_logits()
    row = np.array(logits[0], dtype=np.float32)
    first, second = np.argsort(-row)[:2]
    return int(first), int(second), float(row[first] - row[second])


def test_torch_and_mlx_agree_on_greedy_tokens(smollm2_gguf: Path) -> None:
    bundle = load_model(smollm2_gguf)
    tokenizer = bundle.tokenizer
    template = ChatTemplate(
        bundle.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
    )
    prompts = [
        tokenizer.encode(template.render([{"role": "user", "content": p}]), add_special_tokens=False)
        for p in PROMPTS
    ]
    options = RunnerOptions(device="cpu", dtype="float32")
    runners = {name: create_runner(name, bundle, options) for name in ("torch", "mlx")}
    outputs = {name: greedy(runner, bundle, prompts) for name, runner in runners.items()}
    problems = []
    for prompt, ours, theirs in zip(prompts, outputs["mlx"], outputs["torch"], strict=True):
        if ours == theirs:
            continue
        at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        context = prompt + theirs[:at]
        margins = {name: margin(runner, context) for name, runner in runners.items()}
        problems.append(
            f"prompt {tokenizer.decode(prompt)!r}: first difference at output token {at}: {margins}"
        )
    assert not problems, "\n".join(problems)
    assert len({tuple(o) for o in outputs["mlx"]}) == len(PROMPTS)
    assert "Paris" in tokenizer.decode(outputs["mlx"][0])
