"""The real model (SmolLM2-135M-Instruct GGUF Q4_1: Q4_1 linears, Q8_0 tied embedding): three chat
prompts, 48 greedy tokens each, through the whole engine.

- float32 (dense, dequantized weights) is token-identical to transformers fp32 on the same weights.
- bfloat16 with int4 linears (the CPU default) against bfloat16 with everything dequantized: the two
  round differently (group scales vs each weight; bf16 logits), so a near-tie may flip. They must agree
  until such a point, if any: the first differing token must be one of fp32's top two, with fp32 logits
  within `NEAR_TIE` of each other (on the dev box: identical for one prompt; the other two diverge at
  output tokens 17 and 25, where both bf16 runs see an exact bf16 tie and fp32 margins are 0.07/0.06; on
  AVX2 all three differ, each at such a tie). Teacher-forced along the dequantized run's tokens, every
  step's two picks agree or lie within `NEAR_TIE` of each other in fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.helpers.real_model import NEW_TOKENS, PROMPTS, TRACKED_STEPS, chat_prompts, greedy, top2
from tests.helpers.torch_batch import PagedDriver

pytestmark = pytest.mark.slow

NEAR_TIE = 0.25  # fp32 logit gap below which bf16 rounding may legitimately pick the other token


@pytest.fixture(scope="module")
def bundle(smollm2_gguf: Path) -> ModelBundle:
    return load_model(smollm2_gguf)


@pytest.fixture(scope="module")
def prompts(bundle: ModelBundle) -> list[list[int]]:
    return chat_prompts(bundle)


def runner(bundle: ModelBundle, dtype: str, quant_mode: str, monkeypatch: pytest.MonkeyPatch) -> TorchRunner:
    monkeypatch.setenv(quant.QUANT_ENV, quant_mode)
    monkeypatch.setenv("LOCALCHAT_KERNELS", "off")  # the pure-torch path; test_kernels_model.py: ours
    return TorchRunner(bundle, RunnerOptions(device="cpu", dtype=dtype))


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
    for prompt, ours, theirs in zip(prompts, *outputs, strict=True):
        if ours == theirs:
            continue
        at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        first, second, gap = top2(fp32, prompt + theirs[:at])
        detail = f"first difference at output token {at}: int4 {ours[at]}, dequantized {theirs[at]}"
        detail += f"; fp32 top-2 {first}, {second} apart by {gap:.3f}"
        assert {ours[at], theirs[at]} == {first, second} and gap < NEAR_TIE, detail
    # Free runs may all flip at an early near-tie (on AVX2 every prompt did, at a different token each), so
    # the property is checked step by step along the dequantized run's own tokens: each step, int4 picks
    # the dequantized run's token or one within NEAR_TIE of it in fp32's logits.
    for prompt, tokens in zip(prompts, outputs[1], strict=True):
        drivers = [PagedDriver(r, num_blocks=64, block_size=16) for r in (packed, dense, fp32)]
        for driver in drivers:
            driver.add("m", prompt)
        for step in range(TRACKED_STEPS):
            mine, dequantized, reference = (d.step_logits()[1][0].float() for d in drivers)
            pick, want = int(mine.argmax()), int(dequantized.argmax())
            gap = abs(float(reference[pick] - reference[want]))
            assert gap < NEAR_TIE, f"step {step}: int4 {pick}, dequantized {want}; fp32 logit gap {gap:.3f}"
            for driver in drivers:
                driver.feed("m", tokens[step])
