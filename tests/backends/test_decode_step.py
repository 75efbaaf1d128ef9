"""The fused decode step (decode_step.py, csrc/lc_step.h): a decode-only CPU step's layers in one C call
give the per-layer Python path's logits bit for bit, and steps it cannot run fall back to that path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.cpu import decode_step, kernels
from localchat.backends.torch.cpu.one_row import OneRowStep
from localchat.backends.torch.eagle3_proposer import HiddenTaps
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import BatchInputs
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import tiny_hf_model

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

PROMPTS = {"a": [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64], "b": [9, 8, 7], "c": list(range(30, 53))}


def tiny_bundle(
    tmp_path: Path, model_type: str = "llama", qtype: str = "Q4_0", **overrides: Any
) -> ModelBundle:
    hf = tiny_hf_model(
        model_type, vocab_size=TINY_VOCAB_SIZE, hidden_size=256, intermediate_size=512, **overrides
    )
    path = tmp_path / f"{model_type}-{qtype}.gguf"
    return load_model(write_tiny_gguf(path, hf, qtype=qtype, tokenizer_kind="gpt2"))


def cpu_runner(bundle: ModelBundle, dtype: str = "bfloat16", kv: str = "auto") -> TorchRunner:
    return TorchRunner(bundle, RunnerOptions(device="cpu", dtype=dtype, kv_cache_dtype=kv))


def count_fused_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    run = decode_step.FusedDecode.run

    def counted(self: decode_step.FusedDecode, x: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(x.shape[0])
        return run(self, x, *args)

    monkeypatch.setattr(decode_step.FusedDecode, "run", counted)
    hidden = OneRowStep.hidden

    def lean(self: OneRowStep, batch: BatchInputs) -> torch.Tensor:  # the same C call, one decode row
        calls.append(1)
        return hidden(self, batch)

    monkeypatch.setattr(OneRowStep, "hidden", lean)
    return calls


def decode_side_by_side(
    bundle: ModelBundle,
    monkeypatch: pytest.MonkeyPatch,
    dtype: str = "bfloat16",
    kv: str = "auto",
    steps: int = 6,
) -> None:
    """Two runners on one file, the fused one and `LOCALCHAT_DECODE_STEP=layers`, fed the same tokens:
    three rows of different lengths, then one row after two finish; every step's logits equal."""
    fused_driver, layers_driver = (
        PagedDriver(cpu_runner(bundle, dtype, kv)),
        PagedDriver(cpu_runner(bundle, dtype, kv)),
    )
    # each runner's steps read its own resolved copy of the variable
    fused_driver.runner.backend_settings[decode_step.STEP_ENV] = "fused"
    layers_driver.runner.backend_settings[decode_step.STEP_ENV] = "layers"
    for driver in (fused_driver, layers_driver):
        for req_id, prompt in PROMPTS.items():
            driver.add(req_id, prompt)
    for step in range(steps):
        if step == steps // 2:
            for driver in (fused_driver, layers_driver):
                driver.finish("b")
                driver.finish("c")
        ids, fused = fused_driver.step_logits()
        _, layered = layers_driver.step_logits()
        assert torch.equal(fused, layered), f"step {step}: max diff {(fused - layered).abs().max()}"
        for row, req_id in enumerate(ids):
            token = int(layered[row].argmax())
            fused_driver.feed(req_id, token)
            layers_driver.feed(req_id, token)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
# every type the x16 layout holds, and the two 4-bit i-quants (tests/helpers/iquants.py encodes them)
@pytest.mark.parametrize(
    "qtype", [t for t in kernels.BLOCKS if t in kernels.X16_TYPES or t in ("IQ4_NL", "IQ4_XS")]
)
def test_fused_decode_equals_the_layer_path(
    tmp_path: Path, qtype: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every block type (x16-packed where the ISA has kernels), both compute dtypes:
    the fused step ran for every decode step (3 rows, then 1) and matched bit for bit."""
    monkeypatch.setenv(quant.QUANT_ENV, "int4")  # blocks for every matrix, whatever the ISA
    calls = count_fused_runs(monkeypatch)
    decode_side_by_side(tiny_bundle(tmp_path, qtype=qtype), monkeypatch, dtype)
    assert calls == [37, 3, 3, 1, 1, 1]  # step 0 is the prefill: 37 tokens, one decode row each


@pytest.mark.parametrize("activations", ["q8", "precise"])
@pytest.mark.parametrize("isa", kernels.runnable_isas())
def test_fused_decode_runs_on_every_isa(
    tmp_path: Path, isa: str, activations: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The portable C, AVX2 and AVX-512 builds of the step (whichever this CPU runs), with 8-bit and with
    precise activations (lc_linear's two-row form), match their layer path."""
    monkeypatch.setenv(quant.QUANT_ENV, "int4")
    monkeypatch.setenv(kernels.KERNELS_ENV, isa)
    monkeypatch.setenv(quant.ACTIVATIONS_ENV, activations)
    calls = count_fused_runs(monkeypatch)
    decode_side_by_side(tiny_bundle(tmp_path, qtype="Q4_1"), monkeypatch, steps=4)
    assert calls == [37, 3, 1, 1]


@pytest.mark.parametrize(
    ("model_type", "overrides", "fused"),
    [("qwen2", {}, [37, 3, 1, 1]), ("mistral", {"sliding_window": 8}, [3, 1, 1])],
    ids=["qkv-bias", "sliding-window"],
)
def test_fused_decode_covers_biases_and_windows(
    tmp_path: Path,
    model_type: str,
    overrides: dict[str, Any],
    fused: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Qwen2's q|k|v biases and Mistral's sliding window (shorter than the 23-token prompt) in C too.
    Rows of several tokens under a window that matters stay on the layer path, whose prefill rows run
    SDPA there (windowed_attention.py): the prefill, here."""
    monkeypatch.setenv(quant.QUANT_ENV, "int4")
    calls = count_fused_runs(monkeypatch)
    decode_side_by_side(tiny_bundle(tmp_path, model_type, "Q8_0", **overrides), monkeypatch, steps=4)
    assert calls == fused


def test_int8_cache_steps_take_the_layer_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused step reads float32/bf16 caches only: an int8 KV cache keeps the per-layer path, same result."""
    monkeypatch.setenv(quant.QUANT_ENV, "int4")
    calls = count_fused_runs(monkeypatch)
    decode_side_by_side(tiny_bundle(tmp_path, qtype="Q8_0"), monkeypatch, kv="int8", steps=2)
    assert calls == []


def test_plan_declines_what_it_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No plan for layers that are not plain Llama layers (Qwen3's q/k norms) or for dense weights."""
    monkeypatch.setenv(quant.QUANT_ENV, "int4")
    assert cpu_runner(tiny_bundle(tmp_path, qtype="Q8_0")).model.decode_plan() is not None
    assert cpu_runner(tiny_bundle(tmp_path, "qwen3", "Q8_0")).model.decode_plan() is None
    monkeypatch.setenv(quant.QUANT_ENV, "dequant")
    assert cpu_runner(tiny_bundle(tmp_path, qtype="Q4_0")).model.decode_plan() is None


def test_a_bad_step_mode_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(decode_step.STEP_ENV, "fast")
    with pytest.raises(BackendUnavailableError, match=r"LOCALCHAT_DECODE_STEP='fast'.*fused, layers"):
        decode_step.step_mode()
    monkeypatch.setenv(decode_step.STEP_ENV, " Layers ")
    assert decode_step.step_mode() == "layers"


def ragged_prompts(count: int, seed: int) -> dict[str, list[int]]:
    """`count` prompts of 1 to 41 tokens (ragged contexts, several blocks each at block size 4)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 42, (count,), generator=gen).tolist()
    return {
        f"r{i}": torch.randint(3, TINY_VOCAB_SIZE, (n,), generator=gen).tolist()
        for i, n in enumerate(lengths)
    }


def keep_into(kept: list[torch.Tensor]) -> Callable[[BatchInputs, torch.Tensor], None]:
    """An EAGLE-3 tap's sink that keeps every step's copied-out hidden states."""

    def keep(_batch: BatchInputs, aux: torch.Tensor) -> None:
        kept.append(aux)

    return keep


def big_steps_side_by_side(
    bundle: ModelBundle,
    prompts: dict[str, list[int]],
    schedules: list[dict[str, int]],
    dtype: str = "bfloat16",
    taps: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> None:
    """Both step modes on one file: the prompts' prefill, then each schedule's step (request -> query
    rows: k drafts and the token before them, fed as real tokens), a logits row for every token; each
    step's logits (and with `taps`, the EAGLE-3 inputs each mode copied out) equal bit for bit."""
    drivers = []
    for mode, kept in zip(("fused", "layers"), taps or (None, None), strict=True):
        runner = cpu_runner(bundle, dtype)
        runner.backend_settings[decode_step.STEP_ENV] = mode
        if kept is not None:
            runner.hidden_taps = HiddenTaps([0, 1, 2], keep_into(kept))
        drivers.append(PagedDriver(runner, num_blocks=sum(len(p) + 64 for p in prompts.values()) // 4))
        for req_id, prompt in prompts.items():
            drivers[-1].add(req_id, prompt)
    fused_driver, layers_driver = drivers
    fused_driver.step_logits(), layers_driver.step_logits()  # the prefills (compared by the other tests)
    for step, schedule in enumerate(schedules):
        for driver in drivers:
            for req_id, rows in schedule.items():
                for i in range(rows):
                    driver.feed(req_id, (7 * step + 13 * i + len(req_id)) % (TINY_VOCAB_SIZE - 3) + 3)
        _, fused = fused_driver.step_logits(schedule, every_token=True)
        _, layered = layers_driver.step_logits(schedule, every_token=True)
        assert fused.shape[0] == sum(schedule.values())
        assert torch.equal(fused, layered), f"step {step}: max diff {(fused - layered).abs().max()}"
        if taps is not None:
            assert torch.equal(taps[0][-1], taps[1][-1]), f"step {step}: the copied-out hidden states differ"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_steps_of_24_to_64_rows_run_fused(
    tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the old 24-row limit: plain batched decode (64, 40, 24 one-token rows) and speculative
    verification steps (16 sequences of 2-5 query rows, 6 of 5, 8 of 4 beside 8 of 1), ragged contexts.
    The 1,000-token prefill is above MAX_ROWS: the layer path for both."""
    monkeypatch.setenv(quant.QUANT_ENV, "int4")
    calls = count_fused_runs(monkeypatch)
    prompts = ragged_prompts(64, seed=1)
    names = list(prompts)
    schedules = [
        dict.fromkeys(names, 1),
        dict.fromkeys(names[:40], 1),
        dict.fromkeys(names[10:34], 1),
        {name: 2 + i % 4 for i, name in enumerate(names[:16])},
        dict.fromkeys(names[20:26], 5),
        {name: 4 if i < 8 else 1 for i, name in enumerate(names[30:46])},
    ]
    big_steps_side_by_side(tiny_bundle(tmp_path, qtype="Q4_1"), prompts, schedules, dtype)
    assert sum(len(p) for p in prompts.values()) > decode_step.MAX_ROWS
    assert calls == [sum(s.values()) for s in schedules] == [64, 40, 24, 56, 30, 40]


def test_dense_copies_keep_steps_of_24_rows_or_more_on_the_layer_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With dense copies (quant.linear runs F.linear on them from DENSE_FROM_ROWS rows) the fused call
    takes only the smaller steps, and both paths still agree."""
    monkeypatch.setenv(quant.QUANT_ENV, "copies")
    calls = count_fused_runs(monkeypatch)
    prompts = ragged_prompts(30, seed=2)
    names = list(prompts)
    bundle = tiny_bundle(tmp_path, qtype="Q4_1")
    plan = cpu_runner(bundle).model.decode_plan()
    assert plan is not None and plan.dense_copies
    schedules = [dict.fromkeys(names, 1), dict.fromkeys(names[:6], 3), dict.fromkeys(names[:8], 3)]
    big_steps_side_by_side(bundle, prompts, schedules)
    assert calls == [18]
