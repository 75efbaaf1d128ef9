"""EAGLE-3 keeps the fused C decode step (decode_step.py's run_keeping, csrc/lc_step.h's aux copies).

- The hidden states the fused call copies out equal, bit for bit, the inputs the per-layer path hands the
  head, step after step (rows joining and leaving), and the step's logits stay the plain path's.
- Steps with rows of several tokens (draft verification, prompts) run in the fused call as one decode
  row per token: bit for bit the per-layer path's logits in bfloat16 and float32 (the C RoPE rounds
  x2 * sin + x * cos as torch.addcmul does on the same CPU), past 24 rows too, with the copied-out inputs.
- Under `--speculative eagle` on a block-quantized target, decode-only steps (speculation backed off at a
  batch above max_batch) and verification steps take the fused call (counters, not timing), and greedy
  output is plain greedy's token for token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from localchat.backends.torch import quant
from localchat.backends.torch.cpu import decode_step, kernels
from localchat.backends.torch.eagle3_proposer import HiddenTaps
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from tests.backends.test_decode_step import (
    PROMPTS,
    big_steps_side_by_side,
    count_fused_runs,
    cpu_runner,
    ragged_prompts,
    tiny_bundle,
)
from tests.backends.test_speculative_eagle3_llm import random_eagle_head
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE
from tests.helpers.torch_batch import PagedDriver

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

AUX_LAYERS = [0, 1, 2]  # the tiny target's two layers' inputs and its output (EAGLE-3 reads three)


def keeper(into: list[torch.Tensor]) -> Callable[[BatchInputs, torch.Tensor], None]:
    def keep(_batch: BatchInputs, aux: torch.Tensor) -> None:
        into.append(aux)

    return keep


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelBundle:
    monkeypatch.setenv(quant.QUANT_ENV, "int4")  # blocks for every matrix, whatever the ISA
    return tiny_bundle(tmp_path)


def test_the_fused_step_copies_out_the_layer_paths_hidden_states(
    target: ModelBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept: dict[str, list[torch.Tensor]] = {"fused": [], "layers": []}
    drivers = {}
    taps = {}
    for mode in kept:
        runner = cpu_runner(target)
        settings = getattr(runner, "backend_settings", None)
        if settings is not None:  # a runner that resolves the variables once reads its own copy
            settings[decode_step.STEP_ENV] = mode
        taps[mode] = runner.hidden_taps = HiddenTaps(AUX_LAYERS, keeper(kept[mode]))
        drivers[mode] = PagedDriver(runner)
        for req_id, prompt in PROMPTS.items():
            drivers[mode].add(req_id, prompt)
    for step in range(6):
        if step == 3:
            for driver in drivers.values():
                driver.finish("b")
        logits = {}
        for mode, driver in drivers.items():
            monkeypatch.setenv(decode_step.STEP_ENV, mode)
            ids, logits[mode] = driver.step_logits()
        assert torch.equal(logits["fused"], logits["layers"]), f"step {step}"
        fused, layered = kept["fused"][-1], kept["layers"][-1]
        assert fused.shape == (layered.shape[0], 3 * 256) and fused.dtype == torch.bfloat16
        assert torch.equal(fused, layered), f"step {step}: max diff {(fused - layered).float().abs().max()}"
        for row, req_id in enumerate(ids):
            token = int(logits["layers"][row].argmax())
            for driver in drivers.values():
                driver.feed(req_id, token)
    # step 0 is the prefill (37 tokens, one decode row each): fused too
    assert (taps["fused"].fused_steps, taps["fused"].layer_steps) == (6, 0)
    assert (taps["layers"].fused_steps, taps["layers"].layer_steps) == (0, 6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rows_of_several_tokens_run_fused(
    target: ModelBundle, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the prefill, request "a" gets 3 new tokens a step (a verification of 2 drafts) beside two
    one-token rows; every token's logits compared with the per-layer path."""
    calls = count_fused_runs(monkeypatch)
    drivers = {}
    for mode in ("fused", "layers"):
        runner = cpu_runner(target, dtype)
        settings = getattr(runner, "backend_settings", None)
        if settings is not None:
            settings[decode_step.STEP_ENV] = mode
        drivers[mode] = PagedDriver(runner)
        for req_id, prompt in PROMPTS.items():
            drivers[mode].add(req_id, prompt)
    for step in range(4):
        logits = {}
        for mode, driver in drivers.items():
            monkeypatch.setenv(decode_step.STEP_ENV, mode)
            _, logits[mode] = driver.step_logits(every_token=step > 0)
        fused, layered = logits["fused"], logits["layers"]
        assert torch.equal(fused, layered), f"step {step}: max diff {(fused - layered).abs().max()}"
        for req_id in PROMPTS:
            for driver in drivers.values():
                for token in [7, 8, 9] if req_id == "a" else [11]:
                    driver.feed(req_id, token)
    assert calls == [37, 5, 5, 5]  # step 0 is the prefill (37 tokens)


def test_copying_out_is_checked_and_leaves_the_plain_step_alone(target: ModelBundle) -> None:
    plan = cpu_runner(target).model.decode_plan()
    assert plan is not None
    x = torch.zeros(1, plan.hidden, dtype=plan.dtype)
    with pytest.raises(BackendUnavailableError, match=r"at most 8 of layers 0\.\.2, not \[0, 3\]"):
        plan.run_keeping(x, x, x, None, [], [0, 3])  # type: ignore[arg-type]
    assert plan.args.naux == 0 and plan.args.aux == 0


def engine(target: ModelBundle, head: Path | None, max_batch: int) -> tuple[LLMEngine, HiddenTaps | None]:
    runner = cpu_runner(target)
    proposer = runner.eagle3_proposer(str(head), "tiny", TINY_VOCAB_SIZE) if head else None
    spec = SpeculativeConfig("eagle" if head else "off", num_tokens=3, max_batch=max_batch)
    config = EngineConfig(kv_cache_mib=16, block_size=4, speculative=spec)
    built = LLMEngine(
        runner,
        target.tokenizer,
        config,
        eos_token_ids=[],
        model_max_len=512,
        vocab_size=TINY_VOCAB_SIZE,
        proposer=proposer,
    )
    return built, runner.hidden_taps


def greedy_tokens(built: LLMEngine, lengths: list[int]) -> list[list[int]]:
    prompts = [[5 + i, 17, 99, 3 + 7 * i, 250, 42] for i in range(len(lengths))]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    ids = [built.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    while built.has_unfinished:
        for out in built.step():
            tokens[out.req_id] += out.new_token_ids
    return [tokens[i] for i in ids]


def test_eagle_keeps_the_fused_decode_step_and_plain_greedy_output(
    target: ModelBundle, tmp_path: Path
) -> None:
    """Five requests with speculation's max_batch 2: decode-only steps while more than two run, then
    drafts and their verification once the short ones end; every step fused, the 30-token prefill too."""
    lengths = [4, 6, 8, 24, 24]
    head = random_eagle_head(tmp_path / "head", 256, TINY_VOCAB_SIZE, aux_layers=AUX_LAYERS)
    plain, _ = engine(target, None, max_batch=2)
    expected = greedy_tokens(plain, lengths)
    eagle, taps = engine(target, head, max_batch=2)
    assert greedy_tokens(eagle, lengths) == expected
    assert taps is not None and taps.fused_steps >= 10 and taps.layer_steps == 0
    assert eagle.spec_draft_tokens > 0


def test_steps_past_24_rows_copy_out_the_layer_paths_hidden_states(
    target: ModelBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verification steps of 6 x 5 and 10 x 4 rows and a 48-row decode step (ragged contexts) through
    run_keeping: the copied-out inputs and the logits are the per-layer path's, bit for bit."""
    calls = count_fused_runs(monkeypatch)
    prompts = ragged_prompts(48, seed=3)
    names = list(prompts)
    schedules = [dict.fromkeys(names[:6], 5), dict.fromkeys(names[10:20], 4), dict.fromkeys(names, 1)]
    kept: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    big_steps_side_by_side(target, prompts, schedules, taps=kept)
    assert [t.shape for t in kept[0][1:]] == [(30, 768), (40, 768), (48, 768)]
    assert calls == [30, 40, 48]  # run_keeping's fused calls; the prefill is above MAX_ROWS
    assert len(kept[0]) == len(kept[1]) == 4
