"""Pipeline parallelism across ranks (`--pipeline-parallel-size N`): rank r runs stage r (stages.py).

Hidden states go rank to rank with torch.distributed send/recv on the default group (NCCL on CUDA,
gloo on CPU); the last rank samples and sends the step's RunnerOutput (a few ints per row) to rank 0
over a gloo group, where the engine reads it. Rank 0 keeps as many steps in flight as there are
stages, each of its own group of sequences (in_flight.py, engine/in_flight.py), so while the last
stage runs group A's step the first runs group B's; a large step (a prefill) is also cut into
micro-batches of whole rows so the stages overlap inside it (micro_batches.py). Each rank's KV pool
(and state pool) holds only its layers; the engine sizes them for the tightest rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from localchat.backends import RunnerOptions
from localchat.backends.torch.device import pick_device
from localchat.engine.interface import BatchInputs, KVCacheSpec, RunnerOutput, SchedulerOutput, StateCacheSpec
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig

from .group import COLLECTIVE_TIMEOUT, ParallelGroup
from .layer_split import check_split, check_stageable, stage_runs
from .memory import check_stage_fits
from .micro_batches import MICRO_BATCH_TOKENS, micro_batches
from .shard import sharded_runner
from .stages import (
    NO_COST,
    StageCosts,
    StagePlan,
    StageRunner,
    shared_budget,
    whole_model_specs,
)

FLAG = "--pipeline-parallel-size"


class RankLink:
    """Hidden states to or from a neighbouring rank."""

    def __init__(self, peer: int) -> None:
        self.peer = peer

    def receive(self, tokens: int, hidden: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        x = torch.empty((tokens, hidden), dtype=dtype, device=device)
        dist.recv(x, src=self.peer)
        return x

    def send(self, x: torch.Tensor) -> None:
        dist.send(x.contiguous(), dst=self.peer)


class RankResults:
    """The last rank's answer to rank 0 (pickled over a gloo group: it works beside NCCL too). Under
    TP x PP every rank of the last stage has the answer; its first (`sends`) passes it on."""

    def __init__(self, rank: int, last: int, sends: bool = True, tp: int = 1) -> None:
        self.rank, self.last, self.sends, self.tp = rank, last, sends, tp
        self.group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)  # every rank, same order

    def deliver(self, value: Any, empty: Any) -> Any:
        if self.sends:
            dist.send_object_list([value], dst=0, group=self.group)
        return empty

    def collect(self, empty: Any) -> Any:
        if self.rank != 0:
            return empty
        box: list[Any] = [None]
        dist.recv_object_list(box, src=self.last, group=self.group)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, by rank (a collective: every rank calls it at the same point)."""
        values: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(values, value, group=self.group)
        return values


class PipelineStageRunner(StageRunner):
    """The engine (on rank 0) sees the whole model's K/V and state specs, so it sizes one pool of
    blocks and one of state slots for every stage; each rank allocates both for its own layers only
    (a rank may hold no K/V layer, or no state layer, in a hybrid model)."""

    results: RankResults
    micro_batch_tokens = MICRO_BATCH_TOKENS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rank_costs: list[StageCosts] = self.results.gather(self.stage_costs())
        tp = self.results.tp
        # A stage's TP ranks hold the same layers: count each stage once (its place-0 rank).
        self.model_costs = sum((c for r, c in enumerate(self.rank_costs) if r % tp == 0), NO_COST)
        self.model_kv_spec, self.model_state_spec = whole_model_specs(self.own_kv_spec(), self.model_costs)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return self.model_kv_spec

    @property
    def state_cache_spec(self) -> StateCacheSpec | None:
        return self.model_state_spec

    def _logits(self, batch: BatchInputs) -> torch.Tensor:
        """A large step in micro-batches (micro_batches.py): this stage sends group i on and starts on
        group i + 1 while the next stage works on group i. The last stage's logits, group after group,
        are the step's; sampling then reads them all at once."""
        parts = micro_batches(batch, self.plan.stages, self.micro_batch_tokens)
        if len(parts) == 1:
            return super()._logits(batch)
        return torch.cat([super(PipelineStageRunner, self)._logits(part) for part in parts])

    def start_step(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> None:
        """Rank 0 with steps in flight: this (first, not last) stage's part of a step, its hidden
        states handed on; the output comes later (`receive_output`)."""
        assert not self.plan.last
        if not (scheduler_output.is_empty or batch.num_tokens == 0):  # the workers skip it alike
            self._run_stage(batch)

    def receive_output(self) -> RunnerOutput:
        """The last stage's output of the oldest step this rank has not received yet."""
        output: RunnerOutput = self.results.collect(RunnerOutput(req_ids=[], sampled_token_ids=[]))
        return output

    def available_kv_memory(self) -> int | None:
        """Every rank's budget for its own layers' K/V and state, as one budget in the whole model's
        bytes that the tightest rank can honour (stages.shared_budget); the same on every rank."""
        budgets: list[int | None] = self.results.gather(super().available_kv_memory())
        pools = list(zip(budgets, self.rank_costs, strict=True))
        return shared_budget(pools, self.model_kv_spec, self.model_state_spec)


def check_pipeline(config: ModelConfig, stages: int, path: Path | None = None) -> None:
    """Before any weight is read: one layer per stage at least, and a family the split covers."""
    layers = config.num_hidden_layers
    if stages > layers:
        raise BackendUnavailableError(
            f"{FLAG} {stages} needs at least one layer per stage; this model has {layers}: use at most {layers}."
        )
    check_stageable(config, f"{FLAG} {stages}")
    check_split(config, stage_runs(config, stages, f"{FLAG} {stages}"), f"{FLAG} {stages}", path)


def pipeline_runner(bundle: ModelBundle, options: RunnerOptions, group: ParallelGroup) -> PipelineStageRunner:
    """Rank `group.rank`'s stage: its run of layers (stage_runs), loaded from the checkpoint alone.
    With --tp T too, ranks s*T .. s*T+T-1 form stage s and shard its layers (shard.py) among them;
    each sends to the rank of the same place in the next stage (the hidden states are whole on all)."""
    config, rank, world = bundle.config, group.rank, group.world_size
    tp = options.tensor_parallel_size
    stages = world // tp
    stage, place = divmod(rank, tp)
    check_pipeline(config, stages, bundle.path)
    # Every rank creates every stage's group, in the same order (torch.distributed's rule).
    tp_groups = (
        [dist.new_group(ranks=[s * tp + i for i in range(tp)]) for s in range(stages)] if tp > 1 else []
    )
    runs = stage_runs(config, stages, f"{FLAG} {stages}")
    plan = StagePlan(stage, stages, runs[stage])
    results = RankResults(rank, (stages - 1) * tp, sends=place == 0, tp=tp)
    inbound = None if plan.first else RankLink(rank - tp)
    outbound = None if plan.last else RankLink(rank + tp)
    if tp == 1:
        device = pick_device(options.device)
        check_stage_fits(bundle.path, config, rank, plan.layers, plan.last, device, f"{FLAG} {world}")
        return PipelineStageRunner(bundle, options, plan, inbound, outbound, results)

    def stage_runner(local: ModelBundle, local_options: RunnerOptions) -> PipelineStageRunner:
        return PipelineStageRunner(local, local_options, plan, inbound, outbound, results)

    # The TP slice of the stage (its memory check is TP's).
    runner = sharded_runner(bundle, options, ParallelGroup(place, tp), tp_groups[stage], stage_runner)
    assert isinstance(runner, PipelineStageRunner)
    return runner
