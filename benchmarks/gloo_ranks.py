"""What pp_comm_bench.py and tp_comm_bench.py share: their flags, spawning one process per rank on gloo
(a file rendezvous in a temporary folder), and rank 0's result rows coming back as text.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# rank, world, init method, batches, steps, dtype, result file (the spawned function's arguments)
RankFn = Callable[[int, int, str, list[int], int, str, str], None]


def comm_args(doc: str | None, world_flag: str, steps: int) -> argparse.ArgumentParser:
    """`--tp` / `--pp` (the rank count), the batch sizes, the steps per batch size and the dtype."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument(world_flag, type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    return parser


def join_group(rank: int, world: int, init: str) -> None:
    """In a spawned rank: one compute thread (the ranks share the CPU), then the gloo group."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)


def write_rows(rank: int, out: str, rows: Sequence[Sequence[object]]) -> None:
    """Rank 0's rows, tab-separated, for the parent process; then leave the group."""
    if rank == 0:
        with open(out, "w") as f:
            f.writelines("\t".join(str(v) for v in row) + "\n" for row in rows)
    dist.destroy_process_group()


def run_ranks(rank_fn: RankFn, world: int, batches: list[int], steps: int, dtype: str) -> list[list[str]]:
    """Spawn `world` processes running `rank_fn` and return rank 0's rows (as text fields)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.tsv")
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.start_processes(
            rank_fn,
            args=(world, init, batches, steps, dtype, out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        with open(out) as f:
            return [line.split("\t") for line in f.read().splitlines()]
