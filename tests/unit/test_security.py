"""The Origin / Content-Type / Host gate (localchat/server/security.py) on the in-process app; the
attacks against a real server are in tests/e2e/test_security.py."""

from __future__ import annotations

import pytest

from localchat.server.security import host_name
from tests.helpers.fake_app import fake_client, say

CHAT = {"messages": say("ok"), "max_tokens": 4}


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("[::1]:8000", "[::1]"),
        ("[::1]", "[::1]"),
        ("EVIL.example", "evil.example"),
    ],
)
def test_host_name_drops_the_port(header, name):
    assert host_name(header) == name


def test_loopback_server_answers_only_loopback_names_and_allowed_hosts():
    with fake_client(allowed_hosts=["mybox.lan", "Other.lan:8000"]) as (client, _):
        assert client.get("/health", headers={"Host": "other.lan:9000"}).status_code == 200
        assert client.get("/health", headers={"Host": "mybox.lan:8000"}).status_code == 200
        assert client.get("/health", headers={"Host": "localhost"}).status_code == 200
        r = client.get("/health", headers={"Host": "rebind.evil.example"})
        assert r.status_code == 421
        assert "--allowed-host rebind.evil.example" in r.json()["error"]["message"]


def test_server_bound_elsewhere_checks_host_only_when_asked():
    with fake_client(host="0.0.0.0", api_key="k", allowed_hosts=[]) as (client, _):
        assert client.get("/health", headers={"Host": "anything.example"}).status_code == 200
    with fake_client(host="0.0.0.0", api_key="k", allowed_hosts=["box.lan"]) as (client, _):
        assert client.get("/health", headers={"Host": "box.lan"}).status_code == 200
        assert client.get("/health", headers={"Host": "other.lan"}).status_code == 421


def test_allowed_host_star_turns_the_host_check_off():
    with fake_client(allowed_hosts=["*"]) as (client, _):
        assert client.get("/health", headers={"Host": "anything.example"}).status_code == 200


def test_own_and_allowlisted_origins_pass_others_get_403():
    with fake_client(cors_origins=["http://app.example"]) as (client, ctx):
        own = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://testserver.local"})
        assert own.status_code == 200
        listed = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://app.example"})
        assert listed.status_code == 200
        received = ctx.engine.engine.prompt_tokens_total  # counted as a request enters the engine
        for origin in ("http://evil.example", "null", "http://testserver.local:9999"):
            r = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin})
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", origin
            assert f"--cors-origin {origin}" in r.json()["error"]["message"]
        assert ctx.engine.engine.prompt_tokens_total == received


def test_json_routes_need_a_json_content_type():
    with fake_client() as (client, _):
        ok = client.post(
            "/v1/chat/completions",
            content=b'{"messages": [{"role": "user", "content": "<<say:ok>>"}]}',
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert ok.status_code == 200
        for content_type in ("text/plain", "multipart/form-data; boundary=x", None):
            headers = {"Content-Type": content_type} if content_type else {}
            r = client.post("/completions", content=b'{"prompt": "x"}', headers=headers)
            assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
            assert "application/json" in r.json()["error"]["message"]
