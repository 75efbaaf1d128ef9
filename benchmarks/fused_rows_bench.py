"""Engine throughput with the fused CPU decode step capped at 23 rows (how it ran before 2026-11-29)
against its current cap (decode_step.MAX_ROWS), in one process on one loaded model, rounds alternating.

- `spec`: N concurrent code-edit requests (the answer mostly repeats the prompt) with n-gram speculation,
  k drafts each, speculating at up to N sequences (SpeculativeConfig.max_batch = N): verification steps
  of up to N x (k + 1) rows. Also plain decoding of the same requests, for the speedup.
- `plain`: engine_bench's 16 concurrent chat requests without speculation (16-row decode steps plus
  the prompts' prefill steps, whose chunks the fused call now takes too).

Prints, per variant, median aggregate tok/s over the rounds (each round: every request to completion).

OMP_NUM_THREADS=2 python benchmarks/fused_rows_bench.py --mode spec --seqs 6 8 --k 4 --rounds 3
OMP_NUM_THREADS=2 python benchmarks/fused_rows_bench.py --mode plain --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_bench import concurrent
from benchmarks.spec_bench import CODE  # the same function spec_bench's edit prompt repeats
from localchat import LLM, SamplingParams
from localchat.backends.torch.cpu import decode_step
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative import SpeculativeConfig

CAPS = {"cap 23 (before)": 23, f"cap {decode_step.MAX_ROWS} (now)": decode_step.MAX_ROWS}
RENAMES = [
    ("handle", "stream"),
    ("settings", "config"),
    ("number", "index"),
    ("line", "text"),
    ("key", "name"),
    ("value", "item"),
    ("sep", "found"),
    ("path", "filename"),
]


def edit_prompt(i: int) -> str:
    old, new = RENAMES[i % len(RENAMES)]
    return f"Rename the variable `{old}` to `{new}` in this function. Reply with the whole function and nothing else.\n\n{CODE}"


def run_batch(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> float:
    """Every prompt at once, greedy, `tokens` each: aggregate output tok/s from submission to the end."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    for ids in prompts:
        engine.add_request(ids, params)
    produced = 0
    while engine.has_unfinished:
        produced += sum(len(o.new_token_ids) for o in engine.step())
    return produced / (time.perf_counter() - start)


def spec_mode(llm: LLM, args: argparse.Namespace) -> None:
    def engine(spec: SpeculativeConfig) -> LLMEngine:
        return LLMEngine(
            llm.runner,
            llm.tokenizer,
            EngineConfig(kv_cache_mib=args.mem, speculative=spec, enable_prefix_caching=False),
            eos_token_ids=llm.model.config.eos_token_ids or llm.tokenizer.eos_token_ids,
            model_max_len=llm.model.config.max_position_embeddings,
            vocab_size=llm.model.config.vocab_size,
        )

    print("| sequences | variant | plain tok/s | ngram tok/s | ngram / plain |")
    print("|---|---|---|---|---|")
    for seqs in args.seqs:
        prompts = [
            llm.apply_chat_template([{"role": "user", "content": edit_prompt(i)}]) for i in range(seqs)
        ]
        plain = engine(SpeculativeConfig())
        ngram = engine(SpeculativeConfig("ngram", num_tokens=args.k, max_batch=seqs))
        rates: dict[str, dict[str, list[float]]] = {c: {"plain": [], "ngram": []} for c in CAPS}
        for _ in range(args.rounds):
            for cap_name, cap in CAPS.items():
                decode_step.MAX_ROWS = cap
                rates[cap_name]["plain"].append(run_batch(plain, prompts, args.tokens))
                rates[cap_name]["ngram"].append(run_batch(ngram, prompts, args.tokens))
        for cap_name in CAPS:
            p, n = (statistics.median(rates[cap_name][m]) for m in ("plain", "ngram"))
            print(f"| {seqs} | {cap_name} | {p:.1f} | {n:.1f} | {n / p:.2f}x |", flush=True)
        stats = ngram.stats()
        print(
            f"  ngram k={args.k}: {stats.spec_acceptance_rate:.0%} accepted, {stats.tokens_per_target_pass:.2f} tok/pass"
        )


def plain_mode(llm: LLM, args: argparse.Namespace) -> None:
    rates: dict[str, list[float]] = {c: [] for c in CAPS}
    for _ in range(args.rounds):
        for cap_name, cap in CAPS.items():
            decode_step.MAX_ROWS = cap
            llm.engine.block_manager.reset_prefix_cache()
            rates[cap_name].append(concurrent(llm, args.tokens)[1])
    print("| variant | 16 requests tok/s (median) | rounds |")
    print("|---|---|---|")
    for cap_name, values in rates.items():
        print(f"| {cap_name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=".models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--mode", choices=["spec", "plain"], default="spec")
    parser.add_argument("--seqs", type=int, nargs="+", default=[6, 8])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96, help="per request")
    parser.add_argument("--mem", type=int, default=256, help="KV cache MiB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.model, backend="torch", engine_config=EngineConfig(kv_cache_mib=args.mem))
    if args.mode == "spec":
        spec_mode(llm, args)
    else:
        plain_mode(llm, args)


if __name__ == "__main__":
    main()
