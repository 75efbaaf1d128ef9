"""Running an engine's requests to the end and timing their decode, for the benchmarks that alternate
several engines round by round (spec_bench.py, hybrid_spec_bench.py)."""

from __future__ import annotations

import time

from localchat.engine.engine import LLMEngine


def run_timed(engine: LLMEngine) -> tuple[list[int], float]:
    """Step `engine` until nothing is unfinished: the tokens its requests produced, in order, and the
    decode rate in tok/s from the step that gave the first token to the last (so the prompt's prefill
    and the first token are left out)."""
    out: list[int] = []
    first = 0.0
    while engine.has_unfinished:
        for o in engine.step():
            if o.new_token_ids and not out:
                first = time.perf_counter()
            out += o.new_token_ids
    return out, (len(out) - 1) / (time.perf_counter() - first)
