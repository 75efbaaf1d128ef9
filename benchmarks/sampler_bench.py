"""Sampler time per step (torch, CPU): building the engine's SamplingInputs plus `sample`, 16 rows.

python benchmarks/sampler_bench.py [--vocab 49152] [--rows 16] [--context 600] [--steps 50]

Prints a table: per mix, the host build time and the whole step (build + sample), median ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's localchat

from localchat.backends.torch.sampler import new_generator, sample
from localchat.engine.sampling_inputs import build_sampling_inputs
from localchat.engine.sampling_params import SamplingParams

MIXES = {
    "greedy": lambda i: SamplingParams(temperature=0.0),
    "temperature + top_p": lambda i: SamplingParams(temperature=0.8, top_p=0.95),
    "seeded": lambda i: SamplingParams(temperature=0.8, seed=i),
    "penalties": lambda i: SamplingParams(temperature=0.8, repetition_penalty=1.1, presence_penalty=0.5),
    "logit_bias + logprobs 5": lambda i: SamplingParams(
        temperature=0.0, logit_bias={1: 5.0, 2: -100.0}, logprobs=5
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--context", type=int, default=600, help="prompt + output tokens per request")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = new_generator(torch.device("cpu"), 0)
    logits = torch.randn(args.rows, args.vocab)
    tokens = torch.randint(0, args.vocab, (args.rows, args.context)).tolist()
    print(f"| mix ({args.rows} rows, vocab {args.vocab}) | build inputs ms | build + sample ms |")
    print("|---|---|---|")
    for name, make in MIXES.items():
        params = [make(i) for i in range(args.rows)]
        builds, totals = [], []
        for _ in range(args.steps):
            start = time.perf_counter()
            inputs = build_sampling_inputs(
                [(p, t, args.context // 2) for p, t in zip(params, tokens, strict=True)]
            )
            built = time.perf_counter()
            sample(logits, inputs, generator)
            builds.append(built - start)
            totals.append(time.perf_counter() - start)
        print(f"| {name} | {statistics.median(builds) * 1e3:.3f} | {statistics.median(totals) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
