"""Time to first token of a hybrid model's repeated and extended prompts, with prefix caching through
state checkpoints (engine/state_checkpoints.py) against `--state-checkpoints 0` (every turn prefilled
from the start, as before). Both engines live in one process and are measured in alternating rounds,
each round with a fresh random prompt: turn 1 (a new prompt), regenerate (the same prompt), next turn
(prompt + the reply + a new message).

python benchmarks/hybrid_prefix_bench.py --model /tmp/hyb/qwen35-2b-random-q4_k_m.gguf [--prompt 1024]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat.engine.config import EngineConfig
from localchat.engine.sampling_params import SamplingParams
from localchat.llm import LLM


def first_token(llm: LLM, prompt: list[int], max_tokens: int) -> tuple[float, list[int], int, float]:
    """(seconds to the first token, the reply, cached prompt tokens, decode tok/s after the first token)
    of one greedy request run alone."""
    engine: Any = llm.engine
    start = time.perf_counter()
    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    ttft, reply, cached = 0.0, [], 0
    while engine.has_unfinished:
        for out in engine.step():
            if not ttft and out.new_token_ids:
                ttft = time.perf_counter() - start
            reply += out.new_token_ids
            cached = out.num_cached_tokens
    decode_s = time.perf_counter() - start - ttft
    return ttft, reply, cached, (len(reply) - 1) / decode_s if decode_s > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt", type=int, default=1024, help="tokens of turn 1's prompt")
    parser.add_argument("--reply", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kv-mib", type=int, default=1024)
    args = parser.parse_args()
    import numpy as np

    engines = {
        name: LLM(
            args.model,
            backend="torch",
            engine_config=EngineConfig(kv_cache_mib=args.kv_mib, max_num_seqs=4, state_checkpoints=count),
        )
        for name, count in (("checkpoints", 8), ("off", 0))
    }
    rng = np.random.default_rng(0)
    for round_ in range(args.rounds):
        prompt = [int(t) for t in rng.integers(1000, 100_000, size=args.prompt)]
        new_message = [int(t) for t in rng.integers(1000, 100_000, size=24)]
        for name, llm in engines.items():
            t1, reply, _, rate = first_token(llm, prompt, args.reply)
            t2, _, c2, _ = first_token(llm, prompt, 1)
            t3, _, c3, _ = first_token(llm, prompt + reply + new_message, 1)
            print(
                f"round {round_} {name:11s} turn 1 {t1 * 1e3:7.0f} ms, then {rate:5.1f} tok/s | "
                f"regenerate {t2 * 1e3:7.0f} ms "
                f"(cached {c2}) | next turn {t3 * 1e3:7.0f} ms (cached {c3}) | load {_load()}",
                flush=True,
            )


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


if __name__ == "__main__":
    main()
