"""Where a single greedy stream's decode token goes outside the weights (issue #34's ~1 ms a token that is
not weight streaming), in-process, without a profiler's own cost: wall-clock timers around each part of
the engine's step, the async engine's per-step work (the stats snapshot) included.

python benchmarks/step_overhead.py --model .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--tokens 128]

Prints µs per decode token: the scheduler, build_batch, the runner's step (split into the fused C layers,
the LM head, the sampler and the rest), apply_output (stop checks, detokenizer, outputs), stats(), and the
step total, in wall time and in the engine thread's CPU time (steadier on a busy box). `--rounds N`
repeats the measurement and prints each part's median; `--ab` alternates rounds with this session's
Python fast paths off (the sampler's greedy argmax, RoPE rows from cached tables) in the same process;
`--ab-lean` alternates rounds with the decode-only steps' lean inputs off (engine/batch.py's and the
attention metadata's general builders instead); `--ab-one-row` alternates rounds with the one-row step
(backends/torch/cpu/one_row.py) off.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat import LLM, SamplingParams
from localchat.backends.torch import sampler
from localchat.backends.torch.attention_meta import AttentionMetadata
from localchat.backends.torch.cpu import decode_step
from localchat.backends.torch.cpu.one_row import OneRowStep
from localchat.backends.torch.layers import Rotary
from localchat.engine import batch

_GREEDY = sampler.greedy_tokens
_ROTARY = Rotary.__call__
_DECODE_ROWS = batch._decode_rows
_FROM_BATCH = AttentionMetadata.__dict__["from_batch"]
_ONE_ROW = OneRowStep.takes
PROMPT = [{"role": "user", "content": "Write a Python function that merges two sorted lists."}]


class Timers:
    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, int] = defaultdict(int)  # this thread's CPU time: robust to a busy box
        self.on = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            start, cpu = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[name] += time.perf_counter_ns() - start
                self.cpu[name] += time.thread_time_ns() - cpu

        return timed


def instrument(llm: LLM, timers: Timers) -> None:
    engine = llm.engine
    runner: Any = engine.runner
    model = runner.model
    engine.scheduler.schedule = timers.wrap("schedule", engine.scheduler.schedule)  # type: ignore[method-assign]
    engine.build_batch = timers.wrap("build_batch", engine.build_batch)  # type: ignore[method-assign]
    runner.execute_model = timers.wrap("execute_model", runner.execute_model)
    model.logits = timers.wrap("lm_head", model.logits)
    engine.apply_output = timers.wrap("apply_output", engine.apply_output)  # type: ignore[method-assign]
    engine.stats = timers.wrap("stats", engine.stats)  # type: ignore[method-assign]
    fused = model.decode_plan()
    assert fused is not None, "the model does not take the fused decode step"
    decode_step.FusedDecode.run = timers.wrap("c_layers", decode_step.FusedDecode.run)  # type: ignore[method-assign]
    if isinstance(lean := runner._one_row, OneRowStep):  # the one-row step's C call alone (its Python:
        lean.call = timers.wrap("c_layers", lean.call)  # runner_other; FusedDecode.run's: c_layers)
        lean.head_logits = timers.wrap("lm_head", lean.head_logits)  # type: ignore[method-assign]
    from localchat.backends.torch import runner as runner_module

    runner_module.sample = timers.wrap("sample", runner_module.sample)


def decode(llm: LLM, tokens: int, timers: Timers | None) -> float:
    """Seconds per decode token of one greedy request; timers run from the second token on."""
    engine = llm.engine
    engine.add_request(
        llm.apply_chat_template(PROMPT), SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    )
    first = None
    while engine.has_unfinished:
        start, cpu = time.perf_counter_ns(), time.thread_time_ns()
        outs = engine.step()
        engine.stats()  # what the async engine's loop does after every step
        if timers is not None and timers.on:
            timers.ns["step_total"] += time.perf_counter_ns() - start
            timers.cpu["step_total"] += time.thread_time_ns() - cpu
        if first is None and any(o.new_token_ids for o in outs):
            first = time.perf_counter()
            if timers is not None:
                timers.on = True
    if timers is not None:
        timers.on = False
    assert first is not None
    return (time.perf_counter() - first) / (tokens - 1)


def fast_paths(on: bool) -> None:
    """Switch this session's Python fast paths (the sampler's greedy argmax, single-token RoPE rows from
    cached tables) on or off, for --ab."""
    sampler.greedy_tokens = _GREEDY if on else (lambda logits: None)
    Rotary.__call__ = _ROTARY if on else Rotary._tables  # type: ignore[method-assign]


def lean_paths(on: bool) -> None:
    """Decode-only steps' lean inputs on, or off (the general builders), for --ab-lean."""
    batch._decode_rows = _DECODE_ROWS if on else (lambda *args: None)
    general = classmethod(lambda cls, b, device, kv_heads: cls._rows(b, device, kv_heads))
    AttentionMetadata.from_batch = _FROM_BATCH if on else general  # type: ignore[assignment]


def one_row_paths(on: bool) -> None:
    """The one-row step on, or off (the general path), for --ab-one-row."""
    OneRowStep.takes = _ONE_ROW if on else (lambda *args: False)  # type: ignore[method-assign]


def _measure(llm: LLM, timers: Timers, tokens: int) -> dict[str, float]:
    timers.ns.clear()
    timers.cpu.clear()
    per_token = decode(llm, tokens, timers)
    n = tokens - 1
    us = {k: v / n / 1000 for k, v in timers.ns.items()}
    us |= {f"{k} cpu": v / n / 1000 for k, v in timers.cpu.items()}
    for suffix in ("", " cpu"):
        us["runner_other" + suffix] = us["execute_model" + suffix] - sum(
            us[k + suffix] for k in ("c_layers", "lm_head", "sample")
        )
    us["step_other"] = us["step_total"] - sum(
        us[k] for k in ("schedule", "build_batch", "execute_model", "apply_output", "stats")
    )
    us["tok_s"] = 1 / per_token
    return us


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ab", action="store_true", help="alternate rounds with the fast paths off")
    parser.add_argument("--ab-lean", action="store_true", help="alternate rounds with the lean inputs off")
    parser.add_argument(
        "--ab-one-row", action="store_true", help="alternate rounds with the one-row step off"
    )
    args = parser.parse_args()
    llm = LLM(args.model)
    decode(llm, 8, None)
    timers = Timers()
    instrument(llm, timers)
    modes = ("on", "off") if args.ab or args.ab_lean or args.ab_one_row else ("on",)
    switch = lean_paths if args.ab_lean else one_row_paths if args.ab_one_row else fast_paths
    rows: dict[str, dict[str, list[float]]] = {m: defaultdict(list) for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            switch(mode == "on")
            for k, v in _measure(llm, timers, args.tokens).items():
                rows[mode][k].append(v)
    switch(True)
    order = [
        "schedule", "build_batch", "c_layers", "lm_head", "sample", "runner_other", "execute_model",
        "apply_output", "stats", "step_other", "step_total",
    ]  # fmt: skip
    for mode in modes:
        got = rows[mode]
        label = "lean inputs" if args.ab_lean else "one-row step" if args.ab_one_row else "fast paths"
        print(f"{label} {mode}: {statistics.median(got['tok_s']):.1f} tok/s (median of {args.rounds})")
        print(f"{'part':<14} {'wall µs/token':>14} {'CPU µs/token':>13}")
        for k in order:
            cpu = got.get(k + " cpu")
            cpu_text = f"{statistics.median(cpu):>13.1f}" if cpu else f"{'':>13}"
            print(f"{k:<14} {statistics.median(got[k]):>14.1f} {cpu_text}")


if __name__ == "__main__":
    main()
