"""Communication of one pipeline-parallel decode step for a Llama-3-8B shape, timed on gloo (CPU).

No model is loaded: each pair of neighbouring ranks does what one decode step of the stages does
(pipeline.py): a send/recv of the hidden states [batch, 4096] per stage boundary, then the last rank's
sampled tokens (a RunnerOutput: a few ints per row) pickled to rank 0. Compare tp_comm_bench: TP=2
runs 65 all-reduces and an all-gather of the logits in the same step. The step's control message
(rank 0's broadcast of the batch, the same for both) is not timed.

    python -m benchmarks.pp_comm_bench                 # PP=2, batches 1, 8, 32, float32
    python -m benchmarks.pp_comm_bench --pp 2 --batches 1 --steps 50 --dtype bfloat16
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from benchmarks.gloo_ranks import comm_args, join_group, run_ranks, write_rows
from localchat.engine.interface import RunnerOutput

HIDDEN = 4096  # Llama-3-8B


def _rank(rank: int, world: int, init: str, batches: list[int], steps: int, dtype: str, out: str) -> None:
    join_group(rank, world, init)
    results = dist.new_group(backend="gloo")
    kind, last = getattr(torch, dtype), world - 1
    rows = []
    for batch in batches:
        hidden = torch.randn(batch, HIDDEN).to(kind)
        output = RunnerOutput.one_token_each([f"req-{i}" for i in range(batch)], list(range(batch)))
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            if rank > 0:
                dist.recv(hidden, src=rank - 1)
            if rank < last:
                dist.send(hidden, dst=rank + 1)
            if rank == last:
                dist.send_object_list([output], dst=0, group=results)
            elif rank == 0:
                box: list[object] = [None]
                dist.recv_object_list(box, src=last, group=results)
        elapsed = (time.perf_counter() - start) / steps
        rows.append((batch, hidden.numel() * hidden.element_size(), elapsed))
    write_rows(rank, out, rows)


def main() -> None:
    args = comm_args(__doc__, "--pp", steps=50).parse_args()
    lines = run_ranks(_rank, args.pp, args.batches, args.steps, args.dtype)
    print(f"Llama-3-8B shape, PP={args.pp}, gloo on CPU, {args.dtype}, {args.steps} steps per batch size")
    print(
        f"batch  sends/step  hidden per boundary  time/step (a step's {args.pp - 1} boundaries + the output)"
    )
    for batch, payload, elapsed in lines:
        print(
            f"{int(batch):5d}  {args.pp - 1}+1        {int(payload) / 2**10:10.1f} KiB      {float(elapsed) * 1e3:8.2f} ms"
        )


if __name__ == "__main__":
    main()
