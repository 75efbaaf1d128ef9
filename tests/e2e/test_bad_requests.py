"""Malformed and hostile requests against a live server with an API key: each gets the right 4xx as an
OpenAI error object, and the server stays healthy and keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.bad_requests import API_KEY, BAD_REQUESTS, Bad, check_error, send
from tests.helpers.live_server import LiveServer, live_server, server_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def keyed_server(backend, model_path):
    with live_server(server_args(backend, model_path), api_key=API_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(keyed_server: LiveServer):
    with httpx.Client(base_url=keyed_server.base_url, timeout=120) as c:
        yield c


@pytest.mark.parametrize("bad", BAD_REQUESTS, ids=lambda b: b.id)
def test_bad_request(http, keyed_server, bad: Bad):
    check_error(bad, send(http, bad))
    assert http.get("/health").status_code == 200


def test_still_serving_after_all_that(http, keyed_server):
    r = http.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert keyed_server.proc.poll() is None
    with keyed_server.client() as c:
        assert c.get("/metrics").status_code == 200
    assert keyed_server.metrics()["localchat_kv_blocks_used"] == 0
