"""The one-row decode step (backends/torch/cpu/one_row.py): one decode token of one sequence runs from the
batch's arrays straight into the fused layers' C call, and gives the general path's logits bit for bit
(real SmolLM2 across RoPE-table and block edges, a grown block table, a dense embedding table); steps it
must not take run the general path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.backends.torch import runner as runner_module
from localchat.backends.torch.cpu import kernels, one_row
from localchat.backends.torch.cpu.one_row import OneRowStep
from localchat.backends.torch.layers import ROPE_CHUNK, Rotary
from localchat.backends.torch.sampler import SampleResult, sample
from localchat.engine.interface import BatchInputs
from tests.backends.test_decode_step import PROMPTS, cpu_runner, tiny_bundle
from tests.backends.test_rope_chunks import CONFIGS
from tests.helpers.torch_batch import PagedDriver

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")


def _count_lean(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    hidden = OneRowStep.hidden

    def counted(self: OneRowStep, batch: BatchInputs) -> torch.Tensor:
        calls.append(int(batch.positions[0]))
        return hidden(self, batch)

    monkeypatch.setattr(OneRowStep, "hidden", counted)
    return calls


@pytest.mark.slow
def test_real_model_tokens_and_logits_equal_the_general_path(
    smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """150 greedy tokens of real SmolLM2 (past two RoPE tables and many 16-token blocks, the block
    table's buffer grown from one entry): every step's logits equal the general path's."""
    monkeypatch.setattr(one_row, "BLOCKS_AT_FIRST", 1)
    llm = LLM(smollm2_gguf, device="cpu")
    seen: list[torch.Tensor] = []

    def recorded(logits: torch.Tensor, *args: Any) -> SampleResult:  # what each step samples from
        seen.append(logits.float().clone())
        return sample(logits, *args)

    monkeypatch.setattr(runner_module, "sample", recorded)
    lean = _count_lean(monkeypatch)
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    prompt = ["Write a long story about a cat who learns to code."]
    fast = llm.generate(prompt, params)[0].token_ids
    fast_logits, seen[:] = list(seen), []
    assert len(lean) == 149 and max(lean) > 2 * ROPE_CHUNK
    monkeypatch.setattr(OneRowStep, "takes", lambda *args: False)
    general = llm.generate(prompt, params)[0].token_ids
    assert len(lean) == 149  # not taken the second time
    assert fast == general
    assert len(fast_logits) == len(seen) == 150
    for step, (a, b) in enumerate(zip(fast_logits, seen, strict=True)):
        assert torch.equal(a, b), f"step {step}: max diff {(a - b).abs().max()}"


def _side_by_side(runners: tuple[Any, Any], steps: int = 6) -> None:
    """Three rows, then one after two finish: every step's logits equal between the runners."""
    lean_driver, general_driver = (PagedDriver(r) for r in runners)
    for driver in (lean_driver, general_driver):
        for req_id, prompt in PROMPTS.items():
            driver.add(req_id, prompt)
    for step in range(steps):
        if step == steps // 2:
            for driver in (lean_driver, general_driver):
                driver.finish("b")
                driver.finish("c")
        ids, lean = lean_driver.step_logits()
        _, general = general_driver.step_logits()
        assert torch.equal(lean, general), f"step {step}: max diff {(lean - general).abs().max()}"
        for row, req_id in enumerate(ids):
            token = int(general[row].argmax())
            lean_driver.feed(req_id, token)
            general_driver.feed(req_id, token)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_dense_embedding_table(tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense embedding table (the row copied as F.embedding gathers it) under block-matrix layers."""
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "int4")
    bundle = tiny_bundle(tmp_path, qtype="Q8_0")
    runners = cpu_runner(bundle, dtype), cpu_runner(bundle, dtype)
    for runner in runners:
        model: Any = runner.model  # its weights are block matrices (the loader swapped the parameters)
        table = model.embed
        assert isinstance(table, kernels.BlockMatrix)
        dense = table.ops.dequantize_rows(
            table.segments[0], table.cols, torch.arange(table.shape[0]), model.norm.dtype
        )
        model.embed = dense
        if model.lm_head is None:
            model.lm_head = table  # a tied LM head stays as it was
    runners[1]._one_row = None  # never planned: the general path
    lean = _count_lean(monkeypatch)
    _side_by_side(runners)
    assert isinstance(runners[0]._one_row, OneRowStep)
    assert len(lean) == 3  # the one-row steps after two rows finished


def test_an_int8_cache_takes_the_general_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused layers do not read an int8 cache: neither does the one-row step."""
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "int4")
    bundle = tiny_bundle(tmp_path, qtype="Q4_0")
    lean = _count_lean(monkeypatch)
    runners = cpu_runner(bundle, kv="int8"), cpu_runner(bundle, kv="int8")
    runners[1]._one_row = None
    _side_by_side(runners)
    assert lean == []


@pytest.mark.parametrize("config", CONFIGS[:3] + CONFIGS[4:], ids=["128", "64", "80", "yarn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_row_addresses_are_the_one_row_slices(config: Any, dtype: torch.dtype) -> None:
    rotary = Rotary(config, torch.device("cpu"))
    for position in [0, 1, ROPE_CHUNK - 1, ROPE_CHUNK, 3 * ROPE_CHUNK + 5, 20_000]:
        cos_at, sin_at = rotary.row_addresses(position, dtype)
        cos, sin = rotary(torch.tensor([position]), dtype)
        assert (cos_at, sin_at) == (cos.data_ptr(), sin.data_ptr())
        assert cos.is_contiguous() and sin.is_contiguous()


def test_a_changed_backend_setting_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings are worked out once, not every step, but a runner's edited copy still counts:
    `LOCALCHAT_DECODE_STEP=layers` set between steps sends the next one-row steps the general way."""
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "int4")
    driver = PagedDriver(cpu_runner(tiny_bundle(tmp_path, qtype="Q4_0")))
    driver.add("a", PROMPTS["a"])
    lean = _count_lean(monkeypatch)
    for step in range(4):
        if step == 2:
            driver.runner.backend_settings["LOCALCHAT_DECODE_STEP"] = "layers"
        ids, logits = driver.step_logits()
        driver.feed(ids[0], int(logits[0].argmax()))
    assert len(lean) == 1  # step 0 is the prompt, step 1 one row, then the layer path


@pytest.mark.slow
def test_real_model_seeded_sampling_with_logprobs_equals_the_general_path(
    smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler's full path (temperature, top-k/p, a seed, logprobs, a repetition penalty) on the
    one-row step's logits, outside the step contexts: the same tokens and logprobs as the general path."""
    llm = LLM(smollm2_gguf, device="cpu")
    lean = _count_lean(monkeypatch)
    params = SamplingParams(
        temperature=0.8, top_k=40, top_p=0.9, seed=3, logprobs=2, repetition_penalty=1.1, max_tokens=40
    )
    prompt = ["Name three colours and say why you like them."]
    fast = llm.generate(prompt, params)[0]
    assert len(lean) == len(fast.token_ids) - 1
    monkeypatch.setattr(OneRowStep, "takes", lambda *args: False)
    general = llm.generate(prompt, params)[0]
    assert fast.token_ids == general.token_ids
    assert len(fast.logprobs) == len(fast.token_ids) and fast.logprobs == general.logprobs
