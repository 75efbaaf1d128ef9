"""Decode steps in flight under TP x PP (`--tp 2 --pp 2`: four gloo ranks on the CPU, one thread each):
one step at a time vs two in flight (a group of streams per stage), alternated on the same ranks,
tokens/s after every stream has its first token. The model is pp_micro_bench's random 8-layer
hidden-1024 Llama (no download).

    python -m benchmarks.tp_pp_in_flight_bench --streams 8,16 --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pp_micro_bench import decode_rates, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="8,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="decode tokens per stream")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    args = parser.parse_args()

    from localchat.backends import RunnerOptions
    from localchat.backends.torch.parallel.driver import ParallelRunner

    options = RunnerOptions(
        device="cpu",
        dtype="float32",
        num_threads=1,
        tensor_parallel_size=args.tp,
        pipeline_parallel_size=args.pp,
    )
    runner = ParallelRunner(load(False), options, load=functools.partial(load, False))  # type: ignore[arg-type]
    try:
        decode_rates(8, 4, args.pp, runner)  # warm-up
        for streams in (int(n) for n in args.streams.split(",")):
            rates: dict[int, list[float]] = {1: [], args.pp: []}
            loads = []
            for _ in range(args.repeats):
                for depth in rates:  # alternated
                    rates[depth].append(decode_rates(streams, args.steps, depth, runner))
                    loads.append(Path("/proc/loadavg").read_text().split()[0])
            one, many = statistics.median(rates[1]), statistics.median(rates[args.pp])
            print(
                f"TP={args.tp} x PP={args.pp} gloo, {streams} streams x {args.steps} tokens (load {', '.join(loads)}):"
            )
            print(
                f"  one step at a time:   {one:7.1f} tok/s  (all: {', '.join(f'{r:.1f}' for r in rates[1])})"
            )
            print(
                f"  {args.pp} steps in flight:    {many:7.1f} tok/s  (all: {', '.join(f'{r:.1f}' for r in rates[args.pp])})"
            )
            print(f"  ratio: {many / one:.2f}", flush=True)
    finally:
        runner.shutdown()


if __name__ == "__main__":
    main()
