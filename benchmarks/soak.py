"""Soak test: a real `localchat serve` on a real model, hammered for a while by concurrent clients that
send random-length prompts, ask for random lengths, stream or not, and hang up at random.

    python benchmarks/soak.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf --duration 1200

"After warm-up" means: every client has run --warmup-max requests of the longest prompt and reply the
load can produce, all at once (so the KV blocks of the peak working set have been written once), then
--warmup seconds of the random load. It prints a row a minute (resident memory, KV blocks, requests),
then checks what a long-running server must keep true: resident memory within --rss-tolerance of
what it was after the warm-up, every KV block free again (/metrics), and no request that ended in an
error. Exit status 1 if one fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = os.environ.get("LOCALCHAT_TEST_GGUF", str(REPO / ".models/SmolLM2-135M-Instruct.Q4_1.gguf"))
WORDS = [
    "the",
    "model",
    "answers",
    "a",
    "question",
    "about",
    "rivers",
    "mountains",
    "code",
    "tests",
    "memory",
    "cache",
    "tokens",
    "a",
    "small",
    "local",
    "server",
    "keeps",
    "running",
    "for",
    "hours",
    "while",
    "clients",
    "come",
    "and",
    "go",
    "with",
    "short",
    "and",
    "long",
    "prompts",
]


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    problems: list[str] = field(default_factory=list)


def metrics(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {k: float(v) for k, v in (ln.split() for ln in text.splitlines() if ln and not ln.startswith("#"))}


def start_server(args: argparse.Namespace, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "localchat", "serve", "--f", args.model, "--p", str(port), "--no-ui"]
    cmd += ["--backend", args.backend, "--log", "warning", *args.server_args]
    env = {**os.environ, "LOCALCHAT_HOME": tempfile.mkdtemp(prefix="localchat-soak-")}
    with log_path.open("wb") as log_file:
        return subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, env=env)


def wait_healthy(base: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become healthy")


MAX_PROMPT_WORDS = 400
MAX_REPLY_TOKENS = 200


async def one_request(
    client: httpx.AsyncClient, rng: random.Random, tally: Tally, hang_up_p: float, longest: bool = False
) -> None:
    """A random request; `longest`: the longest prompt and full reply (EOS ignored), never hung up."""
    prompt = " ".join(rng.choices(WORDS, k=MAX_PROMPT_WORDS if longest else rng.randint(3, MAX_PROMPT_WORDS)))
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_REPLY_TOKENS if longest else rng.randint(1, MAX_REPLY_TOKENS),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "seed": rng.randrange(2**31),
        "stream": not longest and rng.random() < 0.7,
        "ignore_eos": longest,
    }
    hang_up_after = rng.randint(1, 20) if body["stream"] and rng.random() < hang_up_p else None
    if not body["stream"]:
        response = await client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            tally.problems.append(f"HTTP {response.status_code}: {response.text[:200]}")
            tally.counts["error"] += 1
            return
        data = response.json()
        tally.tokens += data["usage"]["completion_tokens"]
        tally.counts["complete"] += 1
        return
    chunks = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            tally.problems.append(f"HTTP {response.status_code}: {response.text[:200]}")
            tally.counts["error"] += 1
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                tally.problems.append(f"stream error: {chunk['error']}")
                tally.counts["error"] += 1
                return
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                tally.counts["hung up"] += 1
                return  # leaving the `async with` closes the connection mid-stream
    tally.tokens += max(chunks - 2, 0)  # role chunk and finish chunk carry no token
    tally.counts["complete"] += 1


async def client_loop(base: str, seed: int, until: float, tally: Tally, hang_up_p: float) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        while time.monotonic() < until:
            await one_request(client, rng, tally, hang_up_p)


async def warm_up_longest(base: str, seed: int, clients: int, rounds: int, tally: Tally) -> None:
    async def one_client(i: int) -> None:
        rng = random.Random(seed + i)
        async with httpx.AsyncClient(base_url=base, timeout=600) as client:
            for _ in range(rounds):
                await one_request(client, rng, tally, 0.0, longest=True)

    await asyncio.gather(*(one_client(i) for i in range(clients)))


def anon_rss(pid: int) -> int:
    """Anonymous resident bytes (heap and the KV pool), without the mapped model file."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Row:
    minute: float
    rss: int
    anon: int
    kv_used: float
    kv_free: float
    kv_touched: float
    counts: Counter[str]

    def line(self) -> str:
        c = self.counts
        return (
            f"| {self.minute:4.1f} | {self.rss / 2**20:6.0f} | {self.anon / 2**20:6.0f} | "
            f"{self.kv_used:.0f} / {self.kv_free:.0f} | {self.kv_touched:.0f} | "
            f"{c['complete']} / {c['hung up']} / {c['error']} |"
        )


ROW_HEADER = (
    "| minute | RSS MiB | anon MiB | KV blocks used / free | KV blocks touched | ok / hung up / error |\n"
    "|---|---|---|---|---|---|"
)


def row(server: psutil.Process, m: dict[str, float], minute: float, tally: Tally) -> Row:
    used, total = m["localchat_kv_blocks_used"], m["localchat_kv_blocks_total"]
    return Row(
        minute,
        server.memory_info().rss,
        anon_rss(server.pid),
        used,
        total - used,
        m.get("localchat_kv_blocks_touched", float("nan")),
        Counter(tally.counts),
    )


async def sample_rss(
    server: psutil.Process, base: str, until: float, samples: list[int], tally: Tally, rows: list[Row] | None
) -> None:
    started = next_row = time.monotonic()
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        while time.monotonic() < until:
            samples.append(server.memory_info().rss)
            if rows is not None and time.monotonic() >= next_row:
                m = await ametrics(http)
                rows.append(row(server, m, (time.monotonic() - started) / 60, tally))
                print(rows[-1].line(), flush=True)
                next_row += 60
            await asyncio.sleep(5)


async def ametrics(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    return {k: float(v) for k, v in (ln.split() for ln in text.splitlines() if ln and not ln.startswith("#"))}


async def run_clients(
    args: argparse.Namespace,
    base: str,
    seconds: float,
    tally: Tally,
    seed: int,
    rss: tuple[psutil.Process, list[int]],
    rows: list[Row] | None,
) -> None:
    until = time.monotonic() + seconds
    await asyncio.gather(
        sample_rss(rss[0], base, until, rss[1], tally, rows),
        *(client_loop(base, seed + i, until, tally, args.hang_up) for i in range(args.clients)),
    )


def settle(client: httpx.Client, timeout_s: float = 120) -> dict[str, float]:
    """Wait until no request is in flight (aborts of hung-up clients land at the next step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(client)
        if m["localchat_requests_in_flight"] == 0 or time.monotonic() > deadline:
            time.sleep(2)  # the engine gives its heap back when it goes idle: measure after that
            return metrics(client)
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a GGUF file or a safetensors folder")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--duration", type=float, default=1200, help="seconds of load after the warm-up")
    parser.add_argument("--warmup", type=float, default=60, help="seconds of the same load before measuring")
    parser.add_argument(
        "--warmup-max",
        type=int,
        default=2,
        help="longest requests per client, all at once, before the warm-up",
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--hang-up", type=float, default=0.25, help="share of streams the client abandons")
    parser.add_argument("--rss-tolerance", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("server_args", nargs="*", help="extra `localchat serve` flags (after --)")
    args = parser.parse_args()

    port = int(os.environ.get("SOAK_PORT", "0")) or _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="localchat-soak-")) / "server.log"
    proc = start_server(args, port, log_path)
    try:
        wait_healthy(base, proc, log_path)
        server = psutil.Process(proc.pid)
        http = httpx.Client(base_url=base, timeout=60)
        warm, soak = Tally(), Tally()
        samples: list[int] = []
        rows: list[Row] = []
        asyncio.run(warm_up_longest(base, args.seed + 500, args.clients, args.warmup_max, warm))
        asyncio.run(run_clients(args, base, args.warmup, warm, args.seed, (server, []), None))
        warm_metrics = settle(http)
        rss_warm = server.memory_info().rss
        print(ROW_HEADER)
        print(row(server, warm_metrics, 0.0, soak).line(), "after warm-up", flush=True)
        started = time.monotonic()
        asyncio.run(run_clients(args, base, args.duration, soak, args.seed + 1000, (server, samples), rows))
        elapsed = time.monotonic() - started
        final = settle(http)
        rss_end = server.memory_info().rss
        print(row(server, final, elapsed / 60, soak).line(), "end, settled", flush=True)
        print()
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    growth = (rss_end - rss_warm) / rss_warm
    failed = final.get("localchat_requests_failed_total", 0.0)
    checks = {
        f"RSS within {args.rss_tolerance:.0%} of after warm-up": abs(growth) <= args.rss_tolerance,
        "KV blocks all free": final["localchat_kv_blocks_used"] == 0,
        "no error finishes (engine) and no client errors": failed == 0
        and not soak.counts["error"]
        and not warm.counts["error"],
    }
    requests = sum(soak.counts.values())
    print(
        f"| soak: {args.clients} clients, {elapsed / 60:.1f} min after a {args.warmup:.0f} s warm-up | value |"
    )
    print("|---|---|")
    print(
        f"| requests (complete / hung up / error) | {requests} ({soak.counts['complete']} / "
        f"{soak.counts['hung up']} / {soak.counts['error']}) |"
    )
    print(f"| tokens streamed or returned | {soak.tokens} ({soak.tokens / elapsed:.1f} tok/s) |")
    print(
        f"| server RSS after warm-up / at the end | {rss_warm / 2**20:.0f} / {rss_end / 2**20:.0f} MiB "
        f"({growth:+.1%}) |"
    )
    quarters = [samples[len(samples) * q // 4] for q in (1, 2, 3)] if samples else []
    print(
        f"| server RSS at 1/4, 1/2, 3/4 of the run | {' / '.join(f'{r / 2**20:.0f}' for r in quarters)} MiB |"
    )
    print(
        f"| KV blocks used at the end / total | {final['localchat_kv_blocks_used']:.0f} / "
        f"{final['localchat_kv_blocks_total']:.0f} |"
    )
    print(
        f"| requests finished (server) / failed | {final['localchat_requests_finished_total']:.0f} / {failed:.0f} |"
    )
    print(f"| preemptions | {final['localchat_preemptions_total']:.0f} |")
    print(
        f"| KV blocks touched after warm-up / at the end | {warm_metrics['localchat_kv_blocks_touched']:.0f} / "
        f"{final['localchat_kv_blocks_touched']:.0f} |"
    )
    for name, ok in checks.items():
        print(f"| {name} | {'PASS' if ok else 'FAIL'} |")
    for problem in soak.problems[:10]:
        print("  problem:", problem)
    return 0 if all(checks.values()) else 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    raise SystemExit(main())
