"""Where one single-stream decode token's time goes, on a real GGUF (issue #34's profile of the real
Qwen2.5-Coder-1.5B Q4_K_M: 152k vocabulary, untied Q6_K output, q/k/v biases).

python benchmarks/decode_profile.py --model .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--tokens 64]

Runs the engine in-process (no HTTP), prefills a short chat prompt, then decodes `--tokens` greedy tokens
twice: once timed plainly (tok/s), once under cProfile, printing the cumulative time per decode token of
the engine's parts (the model's forward, the LM head, the sampler, the detokenizer, the scheduler), and
`--torch-profile` adds torch's operator table for a few steps.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat import LLM, SamplingParams

PROMPT = [{"role": "user", "content": "Write a Python function that merges two sorted lists."}]


def decode(llm: LLM, tokens: int) -> float:
    """Seconds per decode token of one greedy request (the first token, prefill's, excluded)."""
    engine = llm.engine
    engine.add_request(
        llm.apply_chat_template(PROMPT), SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    )
    first = None
    while engine.has_unfinished:
        outs = engine.step()
        if first is None and any(o.new_token_ids for o in outs):
            first = time.perf_counter()
    assert first is not None
    return (time.perf_counter() - first) / (tokens - 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=30, help="rows of the cProfile table")
    parser.add_argument("--torch-profile", action="store_true", help="also torch.profiler's operator table")
    args = parser.parse_args()
    llm = LLM(args.model)
    decode(llm, 8)  # first-call allocations
    plain = decode(llm, args.tokens)
    print(f"decode: {1 / plain:.1f} tok/s ({1000 * plain:.2f} ms a token)")
    profile = cProfile.Profile()
    profile.enable()
    profiled = decode(llm, args.tokens)
    profile.disable()
    print(f"under cProfile: {1000 * profiled:.2f} ms a token; cumulative time per call below")
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    if args.torch_profile:
        import torch

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            decode(llm, 16)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
