"""64 concurrent streaming requests with a KV budget that holds about 4 of them: all finish, and each
greedy output equals the same request run alone (preemption and batching change nothing)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.helpers.live_server import live_server, server_args
from tests.helpers.run_async import run_async

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is a cat?",
    "Name a fruit.",
    "Why is the sky blue?",
    "What is 2+2?",
    "Say hello in French.",
    "What is rain?",
    "Who wrote Hamlet?",
    "What is a river?",
]
CONCURRENT = 64
FITS = 4  # requests the KV budget should hold at once


async def _stream(client: httpx.AsyncClient, body: dict) -> tuple[str, str]:
    text, reason = "", None
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
                reason = choice["finish_reason"] or reason
    return text, reason


def _requests(backend: str, capacity_tokens: int, prompt_tokens) -> list[dict]:
    """Eight distinct greedy requests, each sized to about capacity / FITS tokens (prompt + output)."""
    per_request = capacity_tokens // FITS
    bodies = []
    for q in QUESTIONS:
        if backend == "fake":
            reply = (q + " ") * 3
            messages = [{"role": "user", "content": f"<<say:{reply}>>"}]
            filler = per_request - prompt_tokens(messages) - len(reply.encode()) - 1
            messages = [{"role": "system", "content": "x" * filler}, *messages]
            bodies.append({"messages": messages, "temperature": 0})
            continue
        max_tokens = 24
        messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": q}]
        pad = per_request - max_tokens - prompt_tokens(messages)
        messages[0]["content"] = "You are helpful." + " Be kind." * max(pad // 3, 0)
        bodies.append({"messages": messages, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})
    return bodies


def test_64_concurrent_streams_with_a_small_kv_budget(backend, model_path, prompt_tokens):
    # The fake model's KV blocks are tiny (1 MiB holds 8192 tokens): its requests are long instead.
    mem, max_len = ("1", "4096") if backend == "fake" else ("16", "1024")
    with live_server([*server_args(backend, model_path), "--mem", mem, "--max-model-len", max_len]) as server:
        m = server.metrics()
        capacity = int(m["localchat_kv_blocks_total"] * m["localchat_kv_block_size"])
        bodies = _requests(backend, capacity, prompt_tokens)
        need = max(prompt_tokens(b["messages"]) for b in bodies) + 32
        assert FITS - 1 <= capacity // need <= FITS + 2, (capacity, need)

        async def run() -> tuple[list, list]:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as client:
                alone = [await _stream(client, b) for b in bodies]
                together = await asyncio.gather(
                    *(_stream(client, bodies[i % len(bodies)]) for i in range(CONCURRENT))
                )
                return alone, list(together)

        alone, together = run_async(run())
        assert all(text for text, _ in alone)
        differ = [i for i, result in enumerate(together) if result != alone[i % len(bodies)]]
        assert not differ, (
            f"{len(differ)} of {CONCURRENT} greedy outputs differ under load, e.g. "
            f"{together[differ[0]]!r} != {alone[differ[0] % len(bodies)]!r}"
        )
        after = server.metrics()
        assert after["localchat_kv_blocks_used"] == 0 and after["localchat_requests_in_flight"] == 0
        assert after["localchat_requests_finished_total"] >= CONCURRENT + len(bodies)
        assert server.healthy()
