"""TTFT of a repeated prompt over HTTP (regenerate, a client re-sending the same conversation, reruns):
localchat against llama-server on the same GGUF, in alternated rounds.

    python benchmarks/ttft_repeat.py --gguf FILE [--llama-server BIN] [--tree NAME=DIR ...] [--rounds 10]

Every server answers the prompt once before the rounds, so each timed request is a repeat: localchat's
prefix cache holds it (whole blocks, then the last block's first tokens copied: one token runs;
docs/architecture.md), llama-server's slot holds it. `--tree NAME=DIR` serves another localchat checkout
beside this one (e.g. `git archive` of a parent commit into DIR, with the compiled kernels copied in) to
compare before / after. TTFT is the client's: request sent to first content chunk, so it includes the
benchmark client's own httpx set-up (17-30 ms on the dev box) on every side alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.http_vs_llama_server import REPO, _wait_healthy, stop_servers, stream_once


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--llama-server", default=None, help="llama-server binary (omitted: localchat only)")
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR: another localchat checkout")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--port", type=int, default=8741, help="the first port; the others follow")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="ttft-repeat-"))
    trees = [("localchat", str(REPO)), *(t.split("=", 1) for t in args.tree)]
    commands: list[tuple[str, list[str], str]] = []
    for i, (name, tree) in enumerate(trees):
        cmd = [sys.executable, "-m", "localchat", "serve", "--f", args.gguf, "--p", str(args.port + i)]
        commands.append((name, [*cmd, "--no-ui", "--log", "warning"], tree))
    if args.llama_server:
        port = str(args.port + len(trees))
        cmd = [args.llama_server, "-m", args.gguf, "-t", "2", "--port", port, "-c", "4096"]
        commands.append(("llama-server", cmd, str(REPO)))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        bases: dict[str, str] = {}
        for i, (name, cmd, cwd) in enumerate(commands):
            env = {**os.environ, "LOCALCHAT_HOME": str(logs / f"home-{i}")}
            log = logs / f"{i}-{name}.log"
            with log.open("wb") as out:
                procs.append(subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env))
            bases[name] = f"http://127.0.0.1:{args.port + i}/v1"
            _wait_healthy(bases[name], procs[-1], log)
        models = {n: httpx.get(b + "/models", timeout=30).json()["data"][0]["id"] for n, b in bases.items()}
        for name, base in bases.items():  # the first answer: the prompt is cached from here on
            stream_once(base, models[name], args.max_tokens)
        names = list(bases)
        ttft: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                ttft[name].append(stream_once(bases[name], models[name], args.max_tokens).ttft_s)
            row = ", ".join(f"{n} {ttft[n][-1] * 1000:.0f} ms" for n in names)
            print(f"round {r + 1}: {row}, load {_load()}", flush=True)
        medians = ", ".join(
            f"{n} {statistics.median(v) * 1000:.0f} ms (min {min(v) * 1000:.0f})" for n, v in ttft.items()
        )
        print(f"median TTFT of the repeated prompt: {medians}; load {_load()}")
    finally:
        stop_servers(procs)


if __name__ == "__main__":
    main()
