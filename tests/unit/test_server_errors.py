"""Errors on the fake backend: every bad request gets the right 4xx as an OpenAI error object; API key,
CORS allowlist, queue full (503 + Retry-After), shutting down."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers.bad_requests import API_KEY, BAD_REQUESTS, Bad, check_error, send
from tests.helpers.fake_app import fake_client, say

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def keyed():
    with fake_client(api_key=API_KEY) as (client, ctx):
        yield client, ctx


def test_there_are_enough_bad_requests():
    assert len(BAD_REQUESTS) >= 25
    assert len({b.id for b in BAD_REQUESTS}) == len(BAD_REQUESTS)


@pytest.mark.parametrize("bad", BAD_REQUESTS, ids=lambda b: b.id)
def test_bad_request_gets_openai_error(keyed, bad: Bad):
    client, _ = keyed
    check_error(bad, send(client, bad))
    assert client.get("/health").status_code == 200


def test_server_still_serves_after_bad_requests(keyed):
    client, ctx = keyed
    for bad in BAD_REQUESTS[:10]:
        send(client, bad)
    r = client.post("/v1/chat/completions", json={"messages": say("still here")}, headers=AUTH)
    assert r.json()["choices"][0]["message"]["content"] == "still here"
    assert ctx.engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize("headers", [AUTH, {"X-Api-Key": API_KEY}, {"Authorization": f"bearer {API_KEY}"}])
def test_api_key_accepted_forms(keyed, headers):
    client, _ = keyed
    assert client.get("/v1/models", headers=headers).status_code == 200


def test_api_key_cookie_for_the_web_ui(keyed):
    client, _ = keyed
    client.cookies.set("localchat_api_key", API_KEY)
    try:
        assert client.get("/v1/models").status_code == 200
    finally:
        client.cookies.clear()


@pytest.mark.parametrize("path", ["/v1/models", "/models", "/metrics", "/v1/models/fake-model"])
def test_every_route_but_health_needs_the_key(keyed, path):
    client, _ = keyed
    r = client.get(path)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    assert client.get("/health").status_code == 200


def test_unknown_route_without_v1_is_openai_json_too():
    with fake_client() as (client, _):
        r = client.get("/nothing/here")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_cors_only_for_allowlisted_origins():
    allowed = "http://app.example"
    with fake_client(cors_origins=[allowed], api_key=API_KEY) as (client, _):
        ok = client.options(
            "/v1/chat/completions",
            headers={
                "Origin": allowed,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert ok.status_code in (200, 204)
        assert ok.headers.get("access-control-allow-origin") == allowed
        r = client.get("/v1/models", headers={"Origin": allowed, **AUTH})
        assert r.headers.get("access-control-allow-origin") == allowed
        evil = client.get("/v1/models", headers={"Origin": "http://evil.example", **AUTH})
        assert "access-control-allow-origin" not in evil.headers
    with fake_client() as (client, _):
        r = client.get("/v1/models", headers={"Origin": allowed})
        assert "access-control-allow-origin" not in r.headers


def test_body_limit_is_a_setting():
    with fake_client(max_body_mib=0.001) as (client, _):
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 2000}]})
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert "0.001 MiB" in r.json()["error"]["message"]


def test_queue_full_is_503_with_retry_after():
    with fake_client(max_num_seqs=1, max_queue_len=0) as (client, ctx):
        slow = threading.Thread(
            target=client.post,
            args=("/v1/chat/completions",),
            kwargs={"json": {"messages": say("abcdef", 100)}},
        )
        slow.start()
        deadline = time.monotonic() + 10
        while ctx.engine.num_in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = client.post("/v1/chat/completions", json={"messages": say("x")})
        slow.join()
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        assert client.post("/v1/chat/completions", json={"messages": say("x")}).status_code == 200


def test_draining_server_refuses_new_work_with_503():
    with fake_client() as (client, ctx):
        ctx.draining = True
        r = client.post("/v1/chat/completions", json={"messages": say("x")})
        assert r.status_code == 503 and "retry-after" in r.headers
        assert client.get("/health").status_code == 503
        ctx.draining = False
