"""Single-stream decode over HTTP: localchat's server against llama.cpp's `llama-server` on the same GGUF
(issue #34's goal: >= 1.2x llama-server), in alternated rounds.

python benchmarks/http_bench.py --vs-llama-server /path/to/llama-server --gguf FILE [--rounds 3]

Starts both servers (localchat: `python -m localchat serve --f FILE`; llama-server: `-m FILE -t 2`, the
box's threads), then each round sends one streamed chat request to each, alternating which goes first:
the same prompt, `max_tokens` (128) generated greedily with `ignore_eos` (both servers honour it), so both
decode the same number of tokens. Decode tok/s = (tokens - 1) / (last chunk - first chunk): prefill and
the first token excluded. Prints each round, the medians and their ratio, and the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
PROMPT = "Write a Python function that merges two sorted lists, with a docstring and three unit tests."


@dataclass(slots=True)
class Stream:
    tokens: int
    ttft_s: float
    decode_tok_s: float


def stream_once(base: str, model: str, max_tokens: int) -> Stream:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    stamps: list[float] = []
    usage: int | None = None
    with httpx.stream("POST", base + "/chat/completions", json=body, timeout=600) as response:
        if response.status_code != 200:
            response.read()
            raise SystemExit(f"{base} answered {response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                usage = int(chunk["usage"]["completion_tokens"])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise SystemExit(f"{base} streamed {len(stamps)} content chunks")
    tokens = usage if usage is not None else len(stamps)
    # Chunks may carry several tokens (detokenizer hold-back): rate over the whole streamed span.
    return Stream(tokens, stamps[0] - start, (tokens - 1) / (stamps[-1] - stamps[0]))


def _wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base.removesuffix("/v1") + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"{base} did not become healthy; log: {log}")


def compare(llama_server: str, gguf: str, rounds: int, max_tokens: int, ports: tuple[int, int]) -> None:
    logs = Path(tempfile.mkdtemp(prefix="http-vs-llama-"))
    env = {**os.environ, "LOCALCHAT_HOME": str(logs / "home")}
    ours_cmd = [sys.executable, "-m", "localchat", "serve", "--f", gguf, "--p", str(ports[0]), "--no-ui"]
    ours_cmd += ["--log", "warning"]
    theirs_cmd = [llama_server, "-m", gguf, "-t", "2", "--port", str(ports[1]), "-c", "4096"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        servers = {}
        for name, cmd, port in (("localchat", ours_cmd, ports[0]), ("llama-server", theirs_cmd, ports[1])):
            log = logs / f"{name}.log"
            with log.open("wb") as out:
                procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env))
            base = f"http://127.0.0.1:{port}/v1"
            _wait_healthy(base, procs[-1], log)
            servers[name] = base
        models = {
            name: httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
            for name, base in servers.items()
        }
        for name, base in servers.items():  # warm-up: first-call allocations, caches
            stream_once(base, models[name], 16)
        rates: dict[str, list[float]] = {name: [] for name in servers}
        print(f"{Path(gguf).name}: single stream, {max_tokens} tokens greedy (ignore_eos), {rounds} rounds")
        for r in range(rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:
                s = stream_once(servers[name], models[name], max_tokens)
                rates[name].append(s.decode_tok_s)
                load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
                print(
                    f"round {r + 1} {name:>12}: {s.decode_tok_s:6.1f} tok/s decode, {s.tokens} tokens, "
                    f"TTFT {s.ttft_s:.2f}s, load {load}"
                )
        ours, theirs = statistics.median(rates["localchat"]), statistics.median(rates["llama-server"])
        print(
            f"median decode: localchat {ours:.1f} tok/s, llama-server {theirs:.1f} tok/s, ratio {ours / theirs:.2f}x"
        )
    finally:
        stop_servers(procs)


def stop_servers(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every server, then wait for each (killing one that ignores it for 30 s)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
