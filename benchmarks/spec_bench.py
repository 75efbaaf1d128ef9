"""Speculative decoding (n-gram prompt lookup, engine/speculative.py) against plain decoding on a real
model: one stream per prompt kind, greedy, the same model loaded once and shared by both engines, plain and
speculative runs alternated (best of --rounds each).

Prompt kinds: "edit" asks to repeat a code block with a small change (most of the answer is in the
prompt: lookup pays), "chat" is an open question (little to look up). Prints, per kind and k, decode
tok/s without and with speculation, the speedup, the acceptance rate (accepted / scored drafts) and
whether the outputs were token-identical (they must be: greedy is exact).

OMP_NUM_THREADS=2 python benchmarks/spec_bench.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf [--k 2 4 8] [--tokens 128]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat import LLM, SamplingParams
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative import SpeculativeConfig

CODE = """def parse_config(path):
    settings = {}
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"line {number}: expected key=value")
            settings[key.strip()] = value.strip()
    return settings
"""
PROMPTS = {
    "edit": "Rename the variable `handle` to `stream` in this function. Reply with the whole function "
    "and nothing else.\n\n" + CODE,
    "chat": "Explain in a few paragraphs why the sky is blue.",
}


def decode(llm: LLM, engine: LLMEngine, ids: list[int], tokens: int) -> tuple[list[int], float]:
    """Greedy output and decode tok/s (from the first token to the last) of one request."""
    engine.add_request(ids, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    out: list[int] = []
    first = 0.0
    while engine.has_unfinished:
        for o in engine.step():
            if o.new_token_ids and not out:
                first = time.perf_counter()
            out += o.new_token_ids
    return out, (len(out) - 1) / (time.perf_counter() - first)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=".models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="best of N per cell")
    args = parser.parse_args()
    llm = LLM(args.model, backend=args.backend, engine_config=EngineConfig(kv_cache_mib=64))

    def engine(spec: SpeculativeConfig) -> LLMEngine:
        return LLMEngine(
            llm.runner,
            llm.tokenizer,
            EngineConfig(kv_cache_mib=64, speculative=spec),
            eos_token_ids=llm.model.config.eos_token_ids or llm.tokenizer.eos_token_ids,
            model_max_len=llm.model.config.max_position_embeddings,
        )

    print(
        f"{'prompt':<6} {'k':>2} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} {'accepted':>8} same"
    )
    for kind, text in PROMPTS.items():
        ids = llm.apply_chat_template([{"role": "user", "content": text}])
        plain = engine(SpeculativeConfig())
        for k in args.k:
            spec_engine = engine(SpeculativeConfig("ngram", num_tokens=k))
            # Alternate plain and speculative runs, best of each: other load on the machine hits both.
            base_rates, rates, plain_outs, spec_outs = [], [], [], []
            for _ in range(args.rounds):
                base, base_rate = decode(llm, plain, ids, args.tokens)
                out, rate = decode(llm, spec_engine, ids, args.tokens)
                base_rates.append(base_rate)
                rates.append(rate)
                plain_outs.append(base)
                spec_outs.append(out)
            # "varies": the plain runs differ among themselves (the CPU thread count is picked per step
            # by timing, which changes float sums): then no comparison can be exact. OMP_NUM_THREADS
            # fixes the count.
            same = "varies" if len(set(map(tuple, plain_outs))) > 1 else "yes"
            if same == "yes" and any(o != plain_outs[0] for o in spec_outs):
                same = "NO"
            drafted, kept = spec_engine.spec_draft_tokens, spec_engine.spec_accepted_tokens
            print(
                f"{kind:<6} {k:>2} {max(base_rates):>11.1f} {max(rates):>10.1f} "
                f"{max(rates) / max(base_rates):>6.2f}x {kept / max(drafted, 1):>7.0%} {same}"
            )


if __name__ == "__main__":
    main()
