"""`--speculative mtp` on the MLX backend (CPU, float32): plain vs mtp on the random-weight
Qwen3.5-0.8B-shaped folder of benchmarks/mtp_bench.py (built there on its first run), one stream, greedy.
Random weights: the head's drafts are noise, so this measures the cost side (the head's passes and the
rejected verify steps until the back-off stops proposing). Rounds alternate plain and mtp.

python benchmarks/mtp_bench_mlx.py --folder /tmp/qwen35-08b-mtp
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks.mtp_bench import build, decode, timed
from localchat import LLM
from localchat.engine.config import EngineConfig
from localchat.engine.speculative import SpeculativeConfig


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, default=Path("/tmp/qwen35-08b-mtp"))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--kv-mib", type=int, default=256)
    args = parser.parse_args()
    if not (args.folder / "tokenizer.json").is_file():
        args.folder.mkdir(parents=True, exist_ok=True)
        build(args.folder)
    ids = [int(t) for t in np.random.default_rng(0).integers(1000, 100_000, size=40)]

    def loaded(method: str) -> LLM:
        config = EngineConfig(
            kv_cache_mib=args.kv_mib, speculative=SpeculativeConfig(method, num_tokens=args.k)
        )
        return LLM(args.folder, backend="mlx", device="cpu", dtype="float32", engine_config=config)

    plain_llm, mtp_llm = loaded("off"), loaded("mtp")
    plain, _ = decode(plain_llm.engine, ids, args.tokens)
    head_times = timed(mtp_llm.engine.scheduler.proposer)
    rates: dict[str, list[float]] = {"plain": [], "mtp": []}
    for r in range(args.rounds):
        for name, llm in (("plain", plain_llm), ("mtp", mtp_llm)):
            eng = llm.engine
            drafted, kept = eng.spec_draft_tokens, eng.spec_accepted_tokens
            out, rate = decode(eng, ids, args.tokens)
            rates[name].append(rate)
            print(
                f"round {r} {name:6s} {rate:6.2f} tok/s  drafts kept {eng.spec_accepted_tokens - kept}"
                f"/{eng.spec_draft_tokens - drafted}  equal plain: {out == plain}",
                flush=True,
            )
    for name, values in rates.items():
        print(f"{name:6s} median {statistics.median(values):.2f} tok/s")
    if head_times:
        print(
            f"MTP head: {len(head_times)} proposing calls, median {1000 * statistics.median(head_times):.1f} ms"
        )


if __name__ == "__main__":
    main()
