"""What a JSON schema costs: 16 concurrent streams with `response_format` (grammar mask every step)
against the same 16 without, alternating rounds in one process (engine only, no HTTP).

Both runs sample at temperature 1 with the same seeds and produce exactly `max_tokens` each (the plain
run ignores EOS; the schema asks for more list items than fit), so every step has the same 16 rows and
the difference is the grammar: mask fill in the engine, mask application in the sampler.

python benchmarks/structured_bench.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import CONCURRENT_PROMPTS
from localchat import LLM, SamplingParams
from localchat.engine.config import EngineConfig
from localchat.structured.grammar import json_schema_constraint
from localchat.structured.vocabulary import grammar_tokenizer

ANSWER = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 40},
        "sentiment": {"enum": ["positive", "neutral", "negative"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "points": {
            "type": "array",
            "items": {"type": "string", "maxLength": 80},
            "minItems": 40,  # never closes within max_tokens: every request runs to the end
        },
    },
    "required": ["topic", "sentiment", "confidence", "points"],
    "additionalProperties": False,
}


def run(llm: LLM, params: list[SamplingParams]) -> tuple[int, float, float]:
    """(output tokens, seconds, mask seconds) for the 16 requests at once."""
    engine = llm.engine
    prompts = [
        llm.apply_chat_template([{"role": "user", "content": p + " Answer in JSON."}])
        for p in CONCURRENT_PROMPTS
    ]
    mask_time = 0.0
    fill = engine._grammar_bitmask

    def timed(sample_req_ids: list[str]):  # type: ignore[no-untyped-def]
        nonlocal mask_time
        start = time.perf_counter()
        out = fill(sample_req_ids)
        mask_time += time.perf_counter() - start
        return out

    engine._grammar_bitmask = timed  # type: ignore[method-assign]
    start = time.perf_counter()
    for prompt, p in zip(prompts, params, strict=False):  # fewer params: a warm-up subset
        engine.add_request(prompt, p)
    tokens = 0
    while engine.has_unfinished:
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    elapsed = time.perf_counter() - start
    engine._grammar_bitmask = fill  # type: ignore[method-assign]
    engine.block_manager.reset_prefix_cache()
    return tokens, elapsed, mask_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(
        args.model, backend=args.backend, device=args.device, dtype=args.dtype, engine_config=EngineConfig()
    )
    vocabulary = grammar_tokenizer(llm.tokenizer, llm.model.config.vocab_size)
    constraint = json_schema_constraint(vocabulary, ANSWER)
    plain = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, ignore_eos=True)
        for i in range(16)
    ]
    shaped = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, constraint=constraint)
        for i in range(16)
    ]
    run(llm, plain[:2])  # warm-up
    rates: dict[str, list[float]] = {"without schema": [], "with JSON schema": []}
    mask_share: list[float] = []
    for _ in range(args.rounds):
        for name, params in (("without schema", plain), ("with JSON schema", shaped)):
            tokens, seconds, mask_s = run(llm, params)
            rates[name].append(tokens / seconds)
            if mask_s:
                mask_share.append(mask_s / seconds)
    print(f"device: {llm.runner.device_name}, 16 streams, max_tokens {args.max_tokens}, {args.rounds} rounds")
    print("| run | tok/s (median) | rounds |")
    print("|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    # Paired by round (each schema round right after its plain round) to cancel slow drifts in load.
    paired = [w / wo for w, wo in zip(rates["with JSON schema"], rates["without schema"], strict=True)]
    print(
        f"| ratio (schema / plain), median of rounds | {statistics.median(paired):.3f} "
        f"| {', '.join(f'{r:.3f}' for r in paired)} |"
    )
    print(f"| engine time filling masks (schema runs) | {statistics.median(mask_share) * 100:.2f}% | |")


if __name__ == "__main__":
    main()
