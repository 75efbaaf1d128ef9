"""`--gpu-layers N`: one process runs a model's first layers on the CPU and its last N on a GPU (the
split llama.cpp's `--n-gpu-layers` users rely on when a model does not fit the GPU).

The GPU takes the last layers, as llama.cpp does: with them go the final norm and the LM head, the
largest matmul of a decode step (vocab x hidden per token), while the embedding, a row lookup, stays
in RAM where it costs no GPU memory. A step runs the CPU stage, copies its hidden states to the GPU
(one [tokens, hidden] copy per step) and runs the GPU stage, which samples. Each device's KV pool
holds its own layers; the block count is what the tighter of the two allows.

The stages are the pipeline's (stages.py), linked by a copy instead of send/recv; the device pair
is a parameter, so tests run the same code with cpu/cpu.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.device import pick_device
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import (
    BatchInputs,
    KVCacheSpec,
    ModelRunner,
    RunnerOutput,
    SchedulerOutput,
    StateCacheSpec,
)
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle

from .layer_split import check_split, check_stageable
from .memory import check_stage_fits
from .stages import (
    NO_COST,
    StageCosts,
    StagePlan,
    StageRunner,
    shared_budget,
    whole_model_specs,
)

log = logging.getLogger(__name__)
FLAG = "--gpu-layers"


class Handoff:
    """The CPU stage's output, picked up by the GPU stage (a Link inside one process)."""

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None

    def send(self, x: torch.Tensor) -> None:
        self.value = x

    def receive(self, tokens: int, hidden: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        x, self.value = self.value, None
        if x is None:  # the GPU stage's warm-up (sizing its KV pool) runs alone: any input does
            return torch.zeros((tokens, hidden), dtype=dtype, device=device)
        return x.to(device=device, dtype=dtype)  # the two devices may compute in different dtypes


class SameProcess:
    """Results: the last stage's value is already where the engine reads it."""

    def deliver(self, value: Any, empty: Any) -> Any:
        return value

    def collect(self, empty: Any) -> Any:
        return empty


class SplitRunner:
    """The engine's ModelRunner over the stages of one process, run in order for every call."""

    def __init__(self, stages: list[StageRunner]) -> None:
        self.stages = stages

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """Every stage's K/V layers, in the last (GPU) stage's element type."""
        return whole_model_specs(self.stages[-1].own_kv_spec(), self._costs())[0]

    @property
    def state_cache_spec(self) -> StateCacheSpec | None:
        """Hybrid models: every stage's state-slot layers (a stage may have none, or only those)."""
        return whole_model_specs(self.stages[-1].own_kv_spec(), self._costs())[1]

    def _costs(self) -> StageCosts:
        return sum((stage.stage_costs() for stage in self.stages), NO_COST)

    @property
    def device_name(self) -> str:
        parts = [
            f"layers {s.plan.layers.start}-{s.plan.layers.stop - 1} on {s.device_name}" for s in self.stages
        ]
        return "; ".join(parts)

    @property
    def pictures_both_ways(self) -> bool:
        """The first stage's (it holds the tower): the engine then never cuts a picture across chunks."""
        return self.stages[0].pictures_both_ways

    def available_kv_memory(self) -> int | None:
        """Each device's budget over the K/V and state of the stages on it, as one budget in the whole
        model's bytes that the tighter device can honour (stages.shared_budget)."""
        budgets = [stage.available_kv_memory() for stage in self.stages]  # in order: warm-ups hand on
        per_device: dict[str, tuple[int | None, StageCosts]] = {}
        for stage, budget in zip(self.stages, budgets, strict=True):
            held, costs = per_device.get(str(stage.device), (budget, NO_COST))
            tighter = budget if held is None else held if budget is None else min(held, budget)
            per_device[str(stage.device)] = (tighter, costs + stage.stage_costs())
        return shared_budget(list(per_device.values()), self.kv_cache_spec, self.state_cache_spec)

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None:
        for stage in self.stages:
            stage.initialize_kv_cache(num_blocks, block_size)

    def initialize_state_cache(self, num_slots: int) -> None:
        for stage in self.stages:
            stage.initialize_state_cache(num_slots)

    def prepare_decode_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        for stage in self.stages:
            stage.prepare_decode_graphs(max_num_seqs, max_model_len)

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        for stage in self.stages[:-1]:
            stage.execute_model(scheduler_output, batch)
        return self.stages[-1].execute_model(scheduler_output, batch)

    def compute_logits(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> torch.Tensor:
        for stage in self.stages[:-1]:
            stage.compute_logits(scheduler_output, batch)
        return self.stages[-1].compute_logits(scheduler_output, batch)

    def shutdown(self) -> None:
        for stage in self.stages:
            stage.shutdown()

    def __getattr__(self, name: str) -> Any:
        if name == "stages":
            raise AttributeError(name)
        return getattr(self.stages[-1], name)  # config, pooling, ...: the stage that samples


def gpu_device(options: RunnerOptions) -> str:
    """The GPU `--gpu-layers` puts layers on: `--device` when it names one (cuda:1), else cuda."""
    if options.device not in ("auto", "cuda") and not options.device.startswith("cuda:"):
        raise BackendUnavailableError(
            f"--gpu-layers puts layers on a CUDA GPU, but --device is {options.device!r}: use --device "
            "auto or cuda[:N], or drop --gpu-layers."
        )
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            "--gpu-layers needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False). "
            "Drop --gpu-layers to run on the CPU, or install a CUDA build of torch on a machine with a GPU."
        )
    return "cuda" if options.device == "auto" else options.device


def split_runner(
    bundle: ModelBundle, options: RunnerOptions, devices: tuple[str, str] | None = None
) -> ModelRunner:
    """The model with its last `options.gpu_layers` layers on the GPU and the rest on the CPU.
    `devices`: (first stage, last stage), default (cpu, the GPU); tests pass (cpu, cpu)."""
    config, count = bundle.config, options.gpu_layers
    layers = config.num_hidden_layers
    if count is None or count < 0:
        raise BackendUnavailableError(f"--gpu-layers takes a layer count (0 to {layers}), got {count}.")
    low, high = devices or ("cpu", gpu_device(options))
    plain = replace(options, gpu_layers=None)
    if count == 0:
        return TorchRunner(bundle, replace(plain, device=low))
    if count >= layers:  # like llama.cpp's -ngl 999: everything on the GPU
        return TorchRunner(bundle, replace(plain, device=high))
    check_stageable(config, f"{FLAG} {count}")
    runs = [range(0, layers - count), range(layers - count, layers)]
    check_split(config, runs, f"{FLAG} {count}", bundle.path)
    check_stage_fits(bundle.path, config, 1, runs[1], True, pick_device(high), f"{FLAG} {count}")
    handoff, results = Handoff(), SameProcess()
    first = StageRunner(bundle, replace(plain, device=low), StagePlan(0, 2, runs[0]), None, handoff, results)
    last = StageRunner(bundle, replace(plain, device=high), StagePlan(1, 2, runs[1]), handoff, None, results)
    log.info(
        "--gpu-layers %d: layers 0-%d on %s, %d-%d on %s",
        count,
        runs[0].stop - 1,
        low,
        runs[1].start,
        layers - 1,
        high,
    )
    return SplitRunner([first, last])
