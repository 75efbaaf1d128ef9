"""`--speculative mtp` on the MLX backend (CPU, float32): plain vs mtp on the random-weight
Qwen3.5-0.8B-shaped folder of benchmarks/mtp_bench.py (built there on its first run), one stream, greedy.
Random weights: the head's drafts are noise, so this measures the cost side (the head's passes and the
rejected verify steps until the back-off stops proposing). Rounds alternate plain and mtp.

python benchmarks/mtp_bench_mlx.py --folder /tmp/qwen35-08b-mtp
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from benchmarks.mtp_bench import build, compare, decode
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
    compare({"plain": plain_llm, "mtp": mtp_llm}, ids, args.tokens, args.rounds, plain)


if __name__ == "__main__":
    main()
