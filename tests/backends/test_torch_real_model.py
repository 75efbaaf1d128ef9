"""The real model (SmolLM2-135M-Instruct GGUF Q4_1: Q4_1 linears, Q8_0 tied embedding): three chat
prompts, 48 greedy tokens each, through the whole engine.

- float32 (dense, dequantized weights) is token-identical to transformers fp32 on the same weights.
- bfloat16 with int4 linears (the CPU default) against bfloat16 with everything dequantized: the two
  round differently (group scales vs each weight; bf16 logits), so a near-tie may flip. They must agree
  until such a point, if any: the first differing token must be one of fp32's top two, with fp32 logits
  within `NEAR_TIE` of each other (on the dev box: identical for one prompt; the other two diverge at
  output tokens 17 and 25, where both bf16 runs see an exact bf16 tie and fp32 margins are 0.07/0.06).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from backends import RunnerOptions
from backends.torch import quant
from backends.torch.runner import TorchRunner
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from localchat.weights.chat_template import ChatTemplate
from localchat.weights.loader import load_model
from tests.helpers.torch_batch import PagedDriver

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion to a child."]
NEW_TOKENS = 48
NEAR_TIE = 0.25  # fp32 logit gap below which bf16 rounding may legitimately pick the other token


@pytest.fixture(scope="module")
def bundle(smollm2_gguf: Path) -> ModelBundle:
    return load_model(smollm2_gguf)


@pytest.fixture(scope="module")
def prompts(bundle: ModelBundle) -> list[list[int]]:
    tokenizer = bundle.tokenizer
    template = ChatTemplate(
        bundle.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
    )
    return [
        tokenizer.encode(template.render([{"role": "user", "content": p}]), add_special_tokens=False)
        for p in PROMPTS
    ]


def runner(bundle: ModelBundle, dtype: str, quant_mode: str, monkeypatch: pytest.MonkeyPatch) -> TorchRunner:
    monkeypatch.setenv(quant.QUANT_ENV, quant_mode)
    return TorchRunner(bundle, RunnerOptions(device="cpu", dtype=dtype))


def greedy(runner: TorchRunner, bundle: ModelBundle, prompts: list[list[int]]) -> list[list[int]]:
    """All prompts at once through the engine (batched decode steps), EOS ignored."""
    engine = LLMEngine(
        runner,
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


def top2(runner: TorchRunner, tokens: list[int]) -> tuple[int, int, float]:
    """(top-1 id, top-2 id, their logit gap) for the token after `tokens`."""
    driver = PagedDriver(runner, num_blocks=64, block_size=16)
    driver.add("m", tokens)
    _, logits = driver.step_logits()
    row = logits[0].numpy()
    first, second = np.argsort(-row)[:2]
    return int(first), int(second), float(row[first] - row[second])


def hf_greedy(bundle: ModelBundle, prompt: list[int]) -> list[int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    c = bundle.config
    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            rms_norm_eps=c.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
            tie_word_embeddings=c.tie_word_embeddings,
        )
    ).eval()
    hf.load_state_dict({w.name: torch.tensor(w.dequantize()) for w in bundle.iter_weights()}, strict=False)
    hf.generation_config.eos_token_id = None  # like ignore_eos: always NEW_TOKENS tokens
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_float32_is_token_identical_to_transformers(
    bundle: ModelBundle, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = greedy(runner(bundle, "float32", "auto", monkeypatch), bundle, prompts)
    expected = [hf_greedy(bundle, p) for p in prompts]
    for prompt, got, want in zip(PROMPTS, ours, expected, strict=True):
        assert len(got) == NEW_TOKENS and got == want, prompt
    assert "Paris" in bundle.tokenizer.decode(ours[0])


def test_int4_linears_track_the_dequantized_bf16_run(
    bundle: ModelBundle, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = runner(bundle, "bfloat16", "auto", monkeypatch)
    assert isinstance(packed.model.layers[0].qkv, quant.Int4Weight)
    dense = runner(bundle, "bfloat16", "dequant", monkeypatch)
    fp32 = runner(bundle, "float32", "dequant", monkeypatch)
    outputs = greedy(packed, bundle, prompts), greedy(dense, bundle, prompts)
    identical = 0
    for prompt, ours, theirs in zip(prompts, *outputs, strict=True):
        if ours == theirs:
            identical += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        first, second, gap = top2(fp32, prompt + theirs[:at])
        detail = f"first difference at output token {at}: int4 {ours[at]}, dequantized {theirs[at]}"
        detail += f"; fp32 top-2 {first}, {second} apart by {gap:.3f}"
        assert {ours[at], theirs[at]} == {first, second} and gap < NEAR_TIE, detail
    assert identical >= 1
