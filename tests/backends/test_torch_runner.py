"""TorchRunner's contract with the engine: state per request, outputs, sizing (the real model: test_torch_real_model.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions, create_runner
from localchat.backends.torch import device
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import KVCacheSpec, SchedulerOutput
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import ModelLoadError
from localchat.weights.tensors import WeightTensor
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]


@pytest.fixture(scope="module")
def runner() -> TorchRunner:
    return fp32_runner(bundle_from_hf(tiny_hf_model("llama")))


def test_registry_builds_the_torch_runner() -> None:
    bundle = bundle_from_hf(tiny_hf_model("qwen3", head_dim=32))
    runner = create_runner("torch", bundle, RunnerOptions(device="cpu", dtype="float32"))
    assert isinstance(runner, TorchRunner)
    assert runner.device_name.startswith("cpu (float32")
    assert runner.kv_cache_spec == KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=32, dtype_bytes=4)


def test_kv_cache_shapes_and_memory(runner: TorchRunner) -> None:
    runner.initialize_kv_cache(num_blocks=10, block_size=8)
    assert len(runner.kv_caches) == 2
    for cache in runner.kv_caches:  # [K|V, kv_heads, slots, head_dim]
        assert cache.shape == (2, 2, 80, 16) and cache.dtype == torch.float32
    free = runner.available_kv_memory()
    assert free is not None and free > 0


def test_sampling_keeps_no_state_across_finish_and_preemption(runner: TorchRunner) -> None:
    """Sampling reads the batch's inputs only: a preempted, penalized, seeded request resumes exactly."""

    def generate(preempt_after: int | None) -> list[int]:
        driver = PagedDriver(runner)
        driver.add("a", PROMPT, SamplingParams(temperature=1.0, presence_penalty=1.5, seed=5))
        driver.add("b", PROMPT[:4], SamplingParams(temperature=0.7, seed=3))
        for step in range(6):
            driver.step()
            if step == 1:
                driver.finish("b")
            if step == preempt_after:
                driver.preempt("a")  # it comes back as new, with its output so far
        return driver.tokens("a")[len(PROMPT) :]

    assert not hasattr(runner, "requests")
    straight = generate(None)
    assert generate(2) == straight and len(set(straight)) > 1


def test_empty_step_returns_nothing(runner: TorchRunner) -> None:
    out = SchedulerOutput([], [], {}, 0, finished_req_ids={"gone"})
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, batch = driver.build()
    result = runner.execute_model(out, batch)
    assert result.req_ids == [] and result.sampled_token_ids == []


def test_outputs_align_with_sample_req_ids_and_carry_logprobs(runner: TorchRunner) -> None:
    driver = PagedDriver(runner)
    driver.add("long", PROMPT * 2, SamplingParams(temperature=0.0, logprobs=3))
    driver.add("short", PROMPT[:5], SamplingParams(temperature=0.0))
    out = driver.step({"long": 10, "short": 5})  # "long" is mid-prefill: no token for it
    assert out.req_ids == ["short"] and len(out.sampled_token_ids) == 1
    assert out.logprobs is None
    out = driver.step()
    assert out.req_ids == ["long", "short"]
    assert out.logprobs is not None and out.logprobs[1] == []
    (lp,) = out.logprobs[0]
    assert lp.token_id == out.sampled_token_ids[0][0] and len(lp.top) == 3
    assert lp.top[0][0] == lp.token_id  # greedy: the sampled token is the most likely one


def test_seeded_requests_repeat_across_runs(runner: TorchRunner) -> None:
    def generate(companions: int) -> list[int]:
        driver = PagedDriver(runner)
        driver.add("seeded", PROMPT, SamplingParams(temperature=1.0, seed=42))
        for i in range(companions):
            driver.add(f"other{i}", PROMPT[i:], SamplingParams(temperature=1.0))
        for _ in range(6):
            driver.step()
        for i in range(companions):
            driver.finish(f"other{i}")
        return driver.tokens("seeded")[len(PROMPT) :]

    assert generate(0) == generate(3)


def test_missing_or_unknown_weights_fail_the_load() -> None:
    bundle = bundle_from_hf(tiny_hf_model("llama"))
    weights = list(bundle.iter_weights())
    bundle.iter_weights = lambda: iter([w for w in weights if "layers.1.mlp.up_proj" not in w.name])
    with pytest.raises(ModelLoadError, match="lacks weights"):
        fp32_runner(bundle)
    extra = WeightTensor("model.layers.0.mlp.extra.weight", (2,), "F32", np.zeros(2, dtype=np.float32))
    bundle.iter_weights = lambda: iter([*weights, extra])
    with pytest.raises(ModelLoadError, match="Unexpected weight"):
        fp32_runner(bundle)


def test_cpu_threads_leave_a_core_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(device, "_TORCH_DEFAULT_THREADS", 8)
    assert device.cpu_threads(None) == 7 and device.cpu_threads(3) == 3
    monkeypatch.setattr(device, "_TORCH_DEFAULT_THREADS", 1)
    assert device.cpu_threads(None) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setattr(device, "_TORCH_DEFAULT_THREADS", 4)
    assert device.cpu_threads(None) == 4  # the user's explicit choice stands
