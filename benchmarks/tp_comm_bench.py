"""Communication of one tensor-parallel decode step for a Llama-3-8B shape, timed on gloo (CPU).

No model is loaded: each rank runs the collectives one decode step of the sharded forward issues
(shard.py) on tensors of their sizes: an all-reduce after the vocab-parallel embedding lookup, two per
layer (after o_proj and down_proj), and an all-gather of the vocab-parallel logits. The step's control
message (rank 0's broadcast of the batch) is small and not timed here.

    python -m benchmarks.tp_comm_bench                 # TP=2, batches 1, 8, 32, float32
    python -m benchmarks.tp_comm_bench --tp 2 --batches 1 --steps 50 --dtype bfloat16
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from benchmarks.gloo_ranks import comm_args, join_group, run_ranks, write_rows

# Llama-3-8B: hidden 4096, 32 layers, vocab 128256.
HIDDEN, LAYERS, VOCAB = 4096, 32, 128256


def step_sizes(batch: int, world: int) -> tuple[list[int], int]:
    """(elements of each all-reduce, elements of each rank's logits part) for one decode step."""
    all_reduces = [batch * HIDDEN] * (1 + 2 * LAYERS)  # embedding + (o, down) per layer
    return all_reduces, batch * -(-VOCAB // world)


def _rank(rank: int, world: int, init: str, batches: list[int], steps: int, dtype: str, out: str) -> None:
    join_group(rank, world, init)
    kind = getattr(torch, dtype)
    rows = []
    for batch in batches:
        reduces, logits = step_sizes(batch, world)
        buffers = [torch.randn(n).to(kind) for n in reduces]
        part = torch.randn(logits).to(kind)
        parts = [torch.empty_like(part) for _ in range(world)]
        for _ in range(3):  # warm up the connections
            dist.all_reduce(buffers[0])
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            for b in buffers:
                dist.all_reduce(b)
            dist.all_gather(parts, part)
        elapsed = (time.perf_counter() - start) / steps
        payload = (sum(reduces) + logits) * part.element_size()
        rows.append((batch, len(reduces), payload, elapsed))
    write_rows(rank, out, rows)


def main() -> None:
    args = comm_args(__doc__, "--tp", steps=20).parse_args()
    lines = run_ranks(_rank, args.tp, args.batches, args.steps, args.dtype)
    print(f"Llama-3-8B shape, TP={args.tp}, gloo on CPU, {args.dtype}, {args.steps} steps per batch size")
    print("batch  collectives  payload/step (per rank)  time/step")
    for batch, count, payload, elapsed in lines:
        print(
            f"{int(batch):5d}  {int(count):7d}+1      {int(payload) / 2**20:10.2f} MiB"
            f"          {float(elapsed) * 1e3:8.2f} ms"
        )


if __name__ == "__main__":
    main()
