"""The process group for tensor parallelism: NCCL on CUDA, gloo on CPU (the CPU-testable twin).

Every collective gets a timeout so a rank that crashed is reported as an error on the others, not a
hang. Ranks come from the caller (a spawned worker's index) or from torchrun's environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from localchat.errors import BackendUnavailableError

COLLECTIVE_TIMEOUT = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class ParallelGroup:
    rank: int
    world_size: int


def init_group(
    rank: int | None,
    world_size: int | None,
    device: torch.device,
    init_method: str | None = None,
    timeout: timedelta = COLLECTIVE_TIMEOUT,
) -> ParallelGroup:
    """Join (or create) the default process group; None rank/world_size: read torchrun's environment."""
    rank = int(os.environ["RANK"]) if rank is None else rank
    world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method or "env://",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    return ParallelGroup(rank, world_size)


def torchrun_rank(tensor_parallel_size: int) -> int | None:
    """This process's rank when torchrun started it (its RANK/WORLD_SIZE environment), else None.
    torchrun's world must be exactly the ranks asked for (--tp x --pp): one process per rank."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    if world != tensor_parallel_size:
        raise BackendUnavailableError(
            f"torchrun started {world} processes (WORLD_SIZE) but --tensor-parallel-size x "
            f"--pipeline-parallel-size is {tensor_parallel_size}: make them equal (torchrun's --nnodes x "
            "--nproc-per-node = --tp x --pp)."
        )
    return int(os.environ["RANK"])


def torchrun_local_rank() -> int | None:
    """torchrun's LOCAL_RANK (this process's index on its machine), None outside torchrun."""
    return int(os.environ["LOCAL_RANK"]) if "RANK" in os.environ and "LOCAL_RANK" in os.environ else None


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def release_groups(runner: Any) -> None:
    """Drop a rank's runner's references to its process groups once they are destroyed. A runner sits
    in reference cycles (its pooler's closure, the engine's steps in flight), so it may live until a
    full garbage collection, and each gloo group it names keeps its sockets, event loop and pipes
    (13 descriptors) open that long: under `--pp` the results group, under TP x PP the stage's group
    in every layer."""
    results = getattr(runner, "results", None)
    if results is not None:
        results.group = None
    model = getattr(runner, "model", None)
    for part in [model, *getattr(model, "layers", ())]:
        if getattr(part, "tp_group", None) is not None:
            part.tp_group = None
