"""HTTP benchmark: the 16-concurrent streaming chat workload (the candle-vllm seed's benchmark.py:
eight prompts, each twice, sent at once) against any OpenAI-compatible base URL.

    python benchmarks/http_bench.py --url http://127.0.0.1:8000/v1
    python benchmarks/http_bench.py --url http://127.0.0.1:8080/v1 --model any   # e.g. llama-server
    python benchmarks/http_bench.py --vs-llama-server BIN --gguf FILE   # single stream vs llama-server

Prints aggregate output tok/s (tokens up to each request's stop), time to first token p50/p95,
per-request latency p50/max and tokens per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as a script: make `benchmarks.workload` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workload import PROMPTS


@dataclass(slots=True)
class Result:
    ttft_s: float
    latency_s: float
    tokens: int


async def one(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, args: argparse.Namespace
) -> Result:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise SystemExit(f"{url} answered {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise SystemExit(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                usage_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    first = first or time.perf_counter()
    end = time.perf_counter()
    # Servers that send no usage chunk: count content chunks (one token each on most servers).
    return Result((first or end) - start, end - start, usage_tokens if usage_tokens is not None else chunks)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(args: argparse.Namespace) -> None:
    base = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(
        headers=headers,
        timeout=httpx.Timeout(30.0, read=600.0),
        limits=httpx.Limits(max_connections=args.concurrency + 4),
    ) as client:
        model = args.model
        if model is None:
            model = (await client.get(base + "/models")).json()["data"][0]["id"]
        url = base + "/chat/completions"
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.concurrency)]
        for _ in range(args.warmup):
            await one(client, url, model, PROMPTS[0], args)
        rows = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            results = await asyncio.gather(*(one(client, url, model, p, args) for p in prompts))
            wall = time.perf_counter() - start
            rows.append((wall, results))
    print(
        f"server {base}  model {model}  {args.concurrency} concurrent streams  max_tokens {args.max_tokens}  "
        f"temperature {args.temperature}"
    )
    header = (
        f"{'run':>3} | {'tok/s':>7} | {'TTFT p50':>8} | {'TTFT p95':>8} | {'lat p50':>7} | {'lat max':>7} | "
        f"{'tokens':>6} | {'tok/req':>7}"
    )
    print(header)
    print("-" * len(header))
    for i, (wall, results) in enumerate(rows, 1):
        tokens = sum(r.tokens for r in results)
        ttft = [r.ttft_s for r in results]
        latency = [r.latency_s for r in results]
        print(
            f"{i:>3} | {tokens / wall:>7.1f} | {pct(ttft, 0.5):>7.2f}s | {pct(ttft, 0.95):>7.2f}s | "
            f"{pct(latency, 0.5):>6.2f}s | {max(latency):>6.2f}s | {tokens:>6} | "
            f"{statistics.mean(r.tokens for r in results):>7.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="OpenAI-compatible base URL")
    parser.add_argument("--model", default=None, help="model id (default: the first of GET /models)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=1, help="single requests sent before measuring")
    parser.add_argument("--repeat", type=int, default=1, help="measured runs (one table row each)")
    parser.add_argument(
        "--vs-llama-server",
        metavar="BIN",
        default=None,
        help="instead: single-stream decode of localchat's server against this llama-server on --gguf, "
        "alternated rounds (benchmarks/http_vs_llama_server.py)",
    )
    parser.add_argument("--gguf", default=None, help="the GGUF both servers load (--vs-llama-server)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (--vs-llama-server)")
    parser.add_argument("--ports", type=int, nargs=2, default=(8731, 8732), help="localchat, llama-server")
    args = parser.parse_args()
    if args.vs_llama_server:
        from benchmarks.http_vs_llama_server import compare

        if not args.gguf:
            parser.error("--vs-llama-server needs --gguf FILE")
        compare(args.vs_llama_server, args.gguf, args.rounds, args.max_tokens, tuple(args.ports))
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
