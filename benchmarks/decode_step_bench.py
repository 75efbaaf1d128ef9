"""A CPU decode step's layers as one fused C call (decode_step.py) against the per-layer Python path, per
row count: plain batched decode (R sequences, one token each) and speculative verification (R / q
sequences of q query rows each: k = q - 1 drafts and the token before them), on ragged contexts.

One runner, one loaded model: the step mode is flipped in the runner's resolved copy of
LOCALCHAT_DECODE_STEP, which each step reads, and the two modes alternate step by step so other load on
the box hits both alike. Times are the model's hidden states (embedding to the last layer's output,
what the mode changes), median over the rounds, plus the whole step (logits of every row included) and
the process's CPU time in the layers (steadier than wall time on a busy box; with one thread the fairest).

OMP_NUM_THREADS=2 python benchmarks/decode_step_bench.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf \
    --rows 8 16 24 32 48 64 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.cpu import decode_step
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.loader import load_model
from tests.helpers.torch_batch import PagedDriver

MODES = ("fused", "layers")


class Timed:
    """Wraps the model's hidden_states to record its wall time per call."""

    def __init__(self, model: Any) -> None:
        self.model, self.inner, self.last, self.cpu = model, model.hidden_states, 0.0, 0.0
        model.hidden_states = self

    def __call__(self, *args: Any) -> torch.Tensor:
        start, cpu = time.perf_counter(), time.process_time()
        out = self.inner(*args)
        self.last, self.cpu = time.perf_counter() - start, time.process_time() - cpu
        return out


def measure(
    runner: TorchRunner, timed: Timed, seqs: int, per_seq: int, context: int, rounds: int
) -> dict[str, Any]:
    driver = PagedDriver(runner, num_blocks=runner_blocks(seqs, context, per_seq, rounds), block_size=16)
    for s in range(seqs):  # ragged contexts: context .. 2 * context tokens
        length = context + (context * s) // max(seqs - 1, 1)
        driver.add(f"r{s}", [(7 * s + 3 * i) % 4000 + 10 for i in range(length)])
    settings: dict[str, str] = runner.backend_settings
    settings[decode_step.STEP_ENV] = "layers"
    driver.step_logits()  # the prefill, untimed
    schedule = {f"r{s}": per_seq for s in range(seqs)}
    hidden: dict[str, list[float]] = {m: [] for m in MODES}
    whole: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for step in range(rounds + 1):
        for mode in MODES if step % 2 else reversed(MODES):
            settings[decode_step.STEP_ENV] = mode
            for req_id in schedule:
                for _ in range(per_seq):
                    driver.feed(req_id, 11 + step)
            start = time.perf_counter()
            driver.step_logits(schedule, every_token=per_seq > 1)
            if step:  # step 0 warms both modes up
                whole[mode].append(time.perf_counter() - start)
                hidden[mode].append(timed.last)
                cpu[mode].append(timed.cpu)
    return {m: tuple(statistics.median(v[m]) * 1e3 for v in (hidden, whole, cpu)) for m in MODES}


def runner_blocks(seqs: int, context: int, per_seq: int, rounds: int) -> int:
    tokens = seqs * (2 * context + 2 * (rounds + 1) * per_seq + 16)
    return tokens // 16 + seqs + 8


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=".models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 24, 32, 48, 64])
    parser.add_argument("--per-seq", type=int, nargs="+", default=[1, 4], help="query rows per sequence")
    parser.add_argument("--context", type=int, default=200, help="shortest context; the longest is twice")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    runner = TorchRunner(load_model(args.model), RunnerOptions(device="cpu", dtype="auto"))
    timed = Timed(runner.model)
    decode_step.MAX_ROWS = 1 << 30  # time the fused call past its cap too
    print(
        f"threads {torch.get_num_threads()}, {Path(args.model).name}, contexts {args.context}..{2 * args.context}"
    )
    print(
        "| rows | sequences x rows | fused ms (layers) | per-layer ms (layers) | fused ms (step) "
        "| per-layer ms (step) | fused CPU ms | per-layer CPU ms | per-layer / fused (layers) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rows in args.rows:
        for per_seq in args.per_seq:
            if rows % per_seq:
                continue
            seqs = rows // per_seq
            got = measure(runner, timed, seqs, per_seq, args.context, args.rounds)
            shape = f"{seqs} x {per_seq}"
            (fh, fw, fc), (lh, lw, lc) = got["fused"], got["layers"]
            print(
                f"| {rows} | {shape} | {fh:.1f} | {lh:.1f} | {fw:.1f} | {lw:.1f} | {fc:.1f} | {lc:.1f} "
                f"| {lh / fh:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
