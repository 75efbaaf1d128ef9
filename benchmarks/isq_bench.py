"""`--isq` on a dense safetensors model: load time, RSS and single-stream decode for none / q4 / q8_0 / q4_k / q4_0.

The dense model is made from a GGUF file: every weight dequantized to bfloat16 and written as one
safetensors file (the tokenizer and config come from the GGUF). Each mode runs in its own process (RSS
is per process), modes alternate over rounds, and the table reports the median and the ratio to `none`.

python benchmarks/isq_bench.py --gguf .models/SmolLM2-135M-Instruct.Q4_1.gguf [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_bench import current_rss_mib
from localchat import SamplingParams
from localchat.weights.loader import load_model

MODES = ("none", "q4", "q8_0", "q4_k", "q4_0")


def write_dense(gguf: Path, out: Path) -> None:
    """Every weight of `gguf` as bfloat16 in one safetensors file (header, then the raw tensors)."""
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    for weight in load_model(gguf).iter_weights():
        values = weight.dequantize().astype(np.float32)
        raw = ((values.view(np.uint32) + 0x8000) >> 16).astype(np.uint16).tobytes()  # round to bf16
        header[weight.name] = {
            "dtype": "BF16",
            "shape": list(weight.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with out.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for raw in chunks:
            f.write(raw)


def run_one(gguf: Path, folder: Path, mode: str, tokens: int) -> dict[str, float]:
    from localchat.backends import RunnerOptions, load_runner
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.weights.safetensors import iter_safetensors_weights, safetensors_files

    start = time.perf_counter()
    files = safetensors_files(folder)
    bundle = replace(
        load_model(gguf), format="safetensors", iter_weights=lambda: iter_safetensors_weights(files)
    )
    options = RunnerOptions(device="cpu", dtype="bfloat16", isq=None if mode == "none" else mode)
    runner = load_runner("torch", bundle, options)
    load_s = time.perf_counter() - start
    engine = LLMEngine(
        runner, bundle.tokenizer, EngineConfig(kv_cache_mib=256), eos_token_ids=[], model_max_len=2048
    )
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.add_request(bundle.tokenizer.encode("The history of the printing press"), params)
    first = None
    while engine.has_unfinished:
        outs = engine.step()
        if first is None and any(o.new_token_ids for o in outs):
            first = time.perf_counter()
    assert first is not None
    decode = (tokens - 1) / (time.perf_counter() - first)
    rss = current_rss_mib() or 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"load_s": load_s, "decode": decode, "rss": rss, "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.gguf, Path(args.child[0]), args.child[1], args.tokens)))
        return
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        write_dense(args.gguf, Path(tmp) / "model.safetensors")
        for _ in range(args.rounds):
            for mode in MODES:
                cmd = [sys.executable, __file__, "--gguf", str(args.gguf), "--tokens", str(args.tokens)]
                out = subprocess.run([*cmd, "--child", tmp, mode], capture_output=True, text=True, check=True)
                results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {m: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for m, rows in results.items()}
    base = med["none"]
    print("| --isq | load s | decode tok/s (x none) | RSS after decode MiB (x none) | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for mode, m in med.items():
        print(
            f"| {mode} | {m['load_s']:.1f} | {m['decode']:.1f} ({m['decode'] / base['decode']:.2f}) "
            f"| {m['rss']:.0f} ({m['rss'] / base['rss']:.2f}) | {m['peak']:.0f} |"
        )


if __name__ == "__main__":
    main()
