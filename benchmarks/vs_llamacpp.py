"""llama.cpp against localchat on the same GGUF file, alternating rounds, printing ratios and peak RSS.

python benchmarks/vs_llamacpp.py --model /tmp/1b-q4_0.gguf --llama-bin ~/llama.cpp/build/bin [--rounds 2]

llama.cpp: `llama-bench` (prefill of 512 tokens; decode of 128 after as many tokens of context as
localchat's chat prompt has, its `-d`, so that both decode over the same length) and
`llama-batched-bench` (16 sequences of 128 prompt + 128 generated tokens: its generation rate).
localchat: benchmarks/engine_bench.py (prefill of its ~500-token chat prompt, single-stream decode
after it, 16 chat requests' aggregate output rate).
Build llama.cpp from the llama-cpp-python sdist's vendored source (README, "Benchmarks"). Each tool runs
in its own process, rounds alternate, and the table shows the median of each side and their ratio
(above 1: localchat faster or, for memory, smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[str, float]:
    """(stdout, peak RSS MiB) of a child process."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{out[-2000:]}")
    return out, usage.ru_maxrss / 1024


def llama_bench(bin_dir: Path, model: str, threads: int, reps: int, extra: list[str]) -> tuple[dict, float]:
    """llama-bench's one result row (tok/s and its settings) and the peak RSS MiB of its process."""
    cmd = [str(bin_dir / "llama-bench"), "-m", model, "-t", str(threads), "-r", str(reps), "-o", "json"]
    out, rss = run([*cmd, *extra])
    return json.loads(out)[0], rss


def llama_cpp(
    bin_dir: Path, model: str, threads: int, reps: int, depth: int, single_only: bool
) -> dict[str, float]:
    """Prefill of 512 tokens from an empty context; decode of 128 tokens after `depth` tokens of
    context (localchat's decode follows its chat prompt, so both attend over the same length)."""
    pp, rss_pp = llama_bench(bin_dir, model, threads, reps, ["-p", "512", "-n", "0"])
    tg, rss_tg = llama_bench(bin_dir, model, threads, reps, ["-p", "0", "-n", "128", "-d", str(depth)])
    prefill, decode, rss = pp["avg_ts"], tg["avg_ts"], max(rss_pp, rss_tg)
    if single_only:
        return {"prefill": prefill, "decode": decode, "peak RSS MiB": rss}
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", model, "-c", "4608", "-b", "2048", "-ub", "512"]
    table, _ = run([*cmd, "-npp", "128", "-ntg", "128", "-npl", "16", "-t", str(threads)])
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    line = next(ln for ln in table.splitlines() if re.match(r"\|\s*128 \|\s*128 \|\s*16 \|", ln))
    batched = float(line.strip("|").split("|")[7])
    return {"prefill": prefill, "decode": decode, "16 sequences": batched, "peak RSS MiB": rss}


def localchat(model: str, threads: int, kv_mib: int, single_only: bool) -> tuple[dict[str, float], int]:
    """Its rates and peak RSS MiB, and the chat prompt's length in tokens (the decode's depth)."""
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "engine_bench.py"),
        "--model",
        model,
        "--mem",
        str(kv_mib),
    ]
    out, rss = run(
        [*cmd, "--threads", str(threads), "--decode-tokens", "128", *(["--single-only"] * single_only)]
    )
    values = {}
    for key, label in (
        ("prefill", "prefill"),
        ("decode", "decode, single"),
        *([] if single_only else [("16 sequences", "16 requests, agg")]),
    ):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"| {label}"))
        values[key] = float(re.findall(r"([0-9.]+) tok/s", line)[0])
    values["peak RSS MiB"] = rss
    prompt = int(re.findall(r"prefill \(([0-9]+)-token chat prompt\)", out)[0])
    return values, prompt


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--llama-bin", type=Path, required=True, help="folder with llama-bench, llama-batched-bench"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--kv-mib", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5, help="llama-bench repetitions per round (its -r)")
    parser.add_argument(
        "--depth",
        type=int,
        help="llama.cpp's decode context in tokens (default: localchat's chat prompt length)",
    )
    parser.add_argument(
        "--single-only", action="store_true", help="prefill, decode and memory only (no 16-sequence runs)"
    )
    args = parser.parse_args()
    theirs: list[dict[str, float]] = []
    ours: list[dict[str, float]] = []
    for i in range(args.rounds):
        values, prompt = localchat(args.model, args.threads, args.kv_mib, args.single_only)
        ours.append(values)
        depth = prompt if args.depth is None else args.depth
        theirs.append(llama_cpp(args.llama_bin, args.model, args.threads, args.reps, depth, args.single_only))
        print(f"round {i + 1}: llama.cpp {theirs[-1]}\n         localchat {ours[-1]}", file=sys.stderr)
    size = Path(args.model).stat().st_size / 2**20
    print(
        f"{Path(args.model).name} ({size:.0f} MiB), {args.threads} threads, {args.rounds} rounds (medians), "
        f"decode after {depth} tokens of context\n"
    )
    print("| metric | llama.cpp | localchat | localchat / llama.cpp |\n|---|---|---|---|")
    for key in ("prefill", "decode", *([] if args.single_only else ["16 sequences"]), "peak RSS MiB"):
        a, b = statistics.median(r[key] for r in theirs), statistics.median(r[key] for r in ours)
        ratio = a / b if key == "peak RSS MiB" else b / a  # memory: above 1 means localchat is smaller
        unit = "" if key == "peak RSS MiB" else " tok/s"
        print(f"| {key} | {a:.1f}{unit} | {b:.1f}{unit} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
