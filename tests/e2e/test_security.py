"""What a hostile web page can make the user's browser send to a local server, against a real
`localchat serve` (fake backend, web UI on): each attack refused before the model runs, while the
openai SDK and the web UI's own htmx requests keep working."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.helpers.fake_app import say
from tests.helpers.live_server import LiveServer, live_server

EVIL = "http://evil.example"
CHAT_BODY = json.dumps({"model": "fake-model", "messages": say("pwned")})
RAN = ("localchat_requests_finished_total", "localchat_prompt_tokens_total")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(["--backend", "fake"], ui=True) as srv:
        yield srv


def _model_runs(server: LiveServer) -> tuple[float, ...]:
    """The engine's counters once they settle: nothing in flight, two reads alike (/metrics shows a
    snapshot the engine thread replaces after each step)."""
    deadline = time.monotonic() + 30
    last: tuple[float, ...] = ()
    while True:
        metrics = server.metrics()
        now = tuple(metrics[name] for name in RAN)
        if metrics["localchat_requests_in_flight"] == 0 and now == last:
            return now
        assert time.monotonic() < deadline, "the engine's counters never settled"
        last = now
        time.sleep(0.1)


def _refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    assert "access-control-allow-origin" not in response.headers


# Each: (what, method, path, headers, body, status, code). The Host of a DNS-rebinding page is the
# attacker's name; everything else comes from a page on another origin or a form with text/plain.
ATTACKS = [
    (
        "cross-origin text/plain POST (no preflight)",
        "POST",
        "/v1/chat/completions",
        {"Origin": EVIL, "Content-Type": "text/plain"},
        CHAT_BODY,
        403,
        "origin_not_allowed",
    ),
    (
        "cross-origin JSON POST without the prefix",
        "POST",
        "/chat/completions",
        {"Origin": EVIL, "Content-Type": "application/json"},
        CHAT_BODY,
        403,
        "origin_not_allowed",
    ),
    (
        "text/plain POST with no Origin",
        "POST",
        "/v1/chat/completions",
        {"Content-Type": "text/plain"},
        CHAT_BODY,
        415,
        "unsupported_media_type",
    ),
    (
        "form-encoded completions POST",
        "POST",
        "/v1/completions",
        {"Content-Type": "application/x-www-form-urlencoded"},
        json.dumps({"prompt": "<<say:pwned>>"}),
        415,
        "unsupported_media_type",
    ),
    (
        "cross-origin UI form post",
        "POST",
        "/ui/chats",
        {"Origin": EVIL, "HX-Request": "true", "Content-Type": "application/x-www-form-urlencoded"},
        "content=%3C%3Csay%3Apwned%3E%3E",
        403,
        "origin_not_allowed",
    ),
    (
        "cross-origin preflight",
        "OPTIONS",
        "/v1/chat/completions",
        {"Origin": EVIL},
        None,
        403,
        "origin_not_allowed",
    ),
    (
        "rebinding: read the models",
        "GET",
        "/v1/models",
        {"Host": "evil.example:80"},
        None,
        421,
        "host_not_allowed",
    ),
    ("rebinding: read the UI", "GET", "/", {"Host": "evil.example"}, None, 421, "host_not_allowed"),
    ("rebinding: health", "GET", "/health", {"Host": "evil.example"}, None, 421, "host_not_allowed"),
    (
        "rebinding: chat",
        "POST",
        "/v1/chat/completions",
        {"Host": "evil.example", "Origin": "http://evil.example", "Content-Type": "application/json"},
        CHAT_BODY,
        421,
        "host_not_allowed",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "code"),
    [a[1:] for a in ATTACKS],
    ids=[a[0] for a in ATTACKS],
)
def test_attack_is_refused_and_the_model_never_runs(server, method, path, headers, body, status, code):
    before = _model_runs(server)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        response = client.request(method, path, headers=headers, content=body)
    _refused(response, status, code)
    assert _model_runs(server) == before, "the model ran for a refused request"


def test_the_openai_sdk_still_works(server):
    before = _model_runs(server)
    client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="fake-model", messages=say("fine"), max_tokens=8)
    assert reply.choices[0].message.content == "fine"
    assert _model_runs(server) > before


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]"])
def test_every_loopback_name_is_answered(server, host):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        assert client.get("/health", headers={"Host": f"{host}:{server.port}"}).status_code == 200


def test_the_web_ui_still_works_from_its_own_origin(server):
    before = _model_runs(server)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        page = client.get("/", headers={"Origin": server.base_url})
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert client.get("/static/app.js").status_code == 200
        r = client.post(
            "/ui/chats",
            data={"content": "<<say:hello>>"},
            headers={"HX-Request": "true", "Origin": server.base_url},
        )
        assert r.status_code == 200, r.text
        assert r.headers["hx-redirect"].startswith("/c/")
    # the answer is generated server-side; the counters settle once it is done
    assert _model_runs(server)[0] == before[0] + 1
