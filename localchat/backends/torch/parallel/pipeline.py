"""Pipeline parallelism across ranks (`--pipeline-parallel-size N`): rank r runs stage r (stages.py).

Hidden states go rank to rank with torch.distributed send/recv on the default group (NCCL on CUDA,
gloo on CPU); the last rank samples and sends the step's RunnerOutput (a few ints per row) to rank 0
over a gloo group, where the engine reads it. One batch is in flight at a time: a step passes through
the stages one after the other (correct, simple; no micro-batch overlap). Each rank's KV pool holds
only its layers, and the ranks agree on the block count the smallest pool allows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from localchat.backends import RunnerOptions
from localchat.backends.torch.device import pick_device
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig

from .group import COLLECTIVE_TIMEOUT, ParallelGroup
from .memory import check_stage_fits
from .shard import sharded_runner
from .stages import StagePlan, StageRunner, check_stageable, split_layers

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

    def __init__(self, rank: int, last: int, sends: bool = True) -> None:
        self.rank, self.last, self.sends = rank, last, sends
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

    def fewest_tokens(self, tokens: int) -> int:
        """The KV tokens every rank's pool can hold: the smallest of the ranks' `tokens`."""
        value = torch.tensor([tokens], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.group)
        return int(value.item())


class PipelineStageRunner(StageRunner):
    results: RankResults

    def available_kv_memory(self) -> int | None:
        """Each rank's budget in tokens of its own layers' K/V; the engine (on rank 0) sizes the pool
        from rank 0's bytes per block, so it gets the smallest rank's token count in rank 0's bytes."""
        budget = super().available_kv_memory()
        per_token = self.kv_bytes_per_token()
        unknown = -1
        tokens = self.results.fewest_tokens(unknown if budget is None else budget // per_token)
        return None if tokens == unknown else tokens * per_token


def check_pipeline(config: ModelConfig, stages: int) -> None:
    """Before any weight is read: one layer per stage at least, and a family the split covers."""
    layers = config.num_hidden_layers
    if stages > layers:
        raise BackendUnavailableError(
            f"{FLAG} {stages} needs at least one layer per stage; this model has {layers}: use at most {layers}."
        )
    check_stageable(config, f"{FLAG} {stages}")


def pipeline_runner(bundle: ModelBundle, options: RunnerOptions, group: ParallelGroup) -> PipelineStageRunner:
    """Rank `group.rank`'s stage: its run of layers (split_layers), loaded from the checkpoint alone.
    With --tp T too, ranks s*T .. s*T+T-1 form stage s and shard its layers (shard.py) among them;
    each sends to the rank of the same place in the next stage (the hidden states are whole on all)."""
    config, rank, world = bundle.config, group.rank, group.world_size
    tp = options.tensor_parallel_size
    stages = world // tp
    stage, place = divmod(rank, tp)
    check_pipeline(config, stages)
    # Every rank creates every stage's group, in the same order (torch.distributed's rule).
    tp_groups = (
        [dist.new_group(ranks=[s * tp + i for i in range(tp)]) for s in range(stages)] if tp > 1 else []
    )
    runs = split_layers(config.num_hidden_layers, stages)
    plan = StagePlan(stage, stages, runs[stage])
    results = RankResults(rank, (stages - 1) * tp, sends=place == 0)
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
