"""Clients that leave mid-request: their requests are aborted, every KV block comes back, the server
stays healthy."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.helpers.run_async import run_async

pytestmark = pytest.mark.slow


def _long_request(backend: str) -> dict:
    if backend == "fake":
        content = "<<slow:20>><<say:" + "a fairly long answer " * 40 + ">>"
        return {"messages": [{"role": "user", "content": content}]}
    # ignore_eos keeps the real model going until max_tokens, long after the client has left.
    return {
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 2000,
        "ignore_eos": True,
    }


def _wait_for_idle(server, timeout: float = 30) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if (
            m["localchat_kv_blocks_used"],
            m["localchat_requests_running"],
            m["localchat_requests_in_flight"],
        ) == (0, 0, 0):
            return m
        assert time.monotonic() < deadline, f"blocks still held after the clients left: {m}"
        time.sleep(0.1)


def test_twenty_streaming_clients_disconnect(server, backend):
    body = {**_long_request(backend), "stream": True}

    async def leave_after_a_few_chunks(client: httpx.AsyncClient) -> int:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= 3:
                    return seen  # leaving the block closes the connection mid-stream
        return seen

    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            return await asyncio.gather(*(leave_after_a_few_chunks(client) for _ in range(20)))

    assert run_async(run()) == [3] * 20
    metrics = _wait_for_idle(server)
    assert metrics["localchat_generation_tokens_total"] > 0
    assert server.healthy()
    with server.client() as c:
        r = c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        )
        assert r.status_code == 200


def test_non_streaming_client_that_times_out_is_aborted(server, backend):
    with httpx.Client(base_url=server.base_url, timeout=1.0) as client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", json=_long_request(backend))
    _wait_for_idle(server)
    assert server.healthy()
