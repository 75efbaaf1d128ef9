"""The torch backend variables are resolved once: a wrong one fails at start-up with every mistake named,
before any weight is read, and a loaded runner's steps read its own copy, not the environment."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from localchat.backend_settings import BACKEND_VARIABLES, backend_variable, resolve_backend_variables
from localchat.backends.torch import kernel_choice
from localchat.config import Settings
from localchat.errors import BackendUnavailableError
from localchat.llm import LLM
from localchat.serving.assembly import runner_options
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

ATTENTION = "LOCALCHAT_TORCH_ATTENTION"
STEP = "LOCALCHAT_DECODE_STEP"


def test_defaults_when_nothing_is_set():
    assert resolve_backend_variables({}) == {v.env: v.default for v in BACKEND_VARIABLES}


def test_every_wrong_variable_is_named_in_one_error():
    env = {"LOCALCHAT_TORCH_QUANT": "int3", "LOCALCHAT_KERNELS": "avx9000", STEP: " LAYERS "}
    with pytest.raises(BackendUnavailableError) as err:
        resolve_backend_variables(env)
    message = err.value.message
    assert (
        "LOCALCHAT_TORCH_QUANT='int3' is not a quantization mode; use one of auto, int4, dequant, copies."
        in message
    )
    assert "LOCALCHAT_KERNELS='avx9000' is not an ISA; use one of auto, off, portable" in message
    assert STEP not in message  # a right value (any case, spaces) is not a problem


def test_the_server_refuses_a_wrong_variable_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ATTENTION, "cuda")
    with pytest.raises(
        BackendUnavailableError, match="LOCALCHAT_TORCH_ATTENTION='cuda' is not an attention kernel"
    ):
        runner_options(Settings())
    monkeypatch.delenv(ATTENTION)
    assert runner_options(Settings()).backend_settings == resolve_backend_variables()


def test_llm_refuses_a_wrong_variable_before_reading_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STEP, "fast")
    # The path does not exist: the error is the variable's, so nothing was read
    with pytest.raises(BackendUnavailableError, match="LOCALCHAT_DECODE_STEP='fast' is not a choice"):
        LLM("/nonexistent/model.gguf")


def test_a_runner_steps_with_its_resolved_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing the environment after the load changes nothing; the runner's copy is what counts."""
    for var in (ATTENTION, STEP):
        monkeypatch.delenv(var, raising=False)
    runner = fp32_runner(bundle_from_hf(tiny_hf_model("llama")))
    assert runner.backend_settings[ATTENTION] == "auto"
    seen: list[tuple[bool, str]] = []
    forward = runner.model.hidden_states

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        kernels = kernel_choice.cpu_decode_kernels(torch.device("cpu"))
        seen.append((kernels is not None, backend_variable(STEP)))
        return forward(*args, **kwargs)

    monkeypatch.setattr(runner.model, "hidden_states", spy)
    driver = PagedDriver(runner)
    driver.add("a", [1, 2, 3, 4, 5])
    with_kernels = kernel_choice.cpu_decode_kernels(torch.device("cpu")) is not None  # False: not built
    monkeypatch.setenv(ATTENTION, "torch")
    monkeypatch.setenv(STEP, "layers")
    driver.step_logits()
    runner.backend_settings[ATTENTION] = "torch"  # what engine_bench --compare-cpu-attention flips
    driver.feed("a", 7)
    driver.step_logits()
    assert seen == [(with_kernels, "fused"), (False, "fused")]
    # Outside the runner's steps the environment is read, as before
    assert backend_variable(STEP) == "layers"
