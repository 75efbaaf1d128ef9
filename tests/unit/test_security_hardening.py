"""The fixes of issue #27 on the in-process app (fast): the gate's path normalization, `Origin: null`,
NUL bytes, nested JSON, loopback by address, the pages' Referrer-Policy, the access log's redaction,
and the data dir's modes. The same attacks against a real
server are in tests/e2e/test_security_hardening.py."""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from localchat import paths
from localchat.config import Settings
from localchat.loopback import is_loopback_host
from localchat.models.manager import ModelManager
from localchat.server.app import create_app
from localchat.server.http_guard import RedactSecrets, redact_query
from localchat.server.runtime import security_warning
from localchat.server.security import HostCheck, route_path
from tests.helpers.fake_app import fake_client, fake_settings, say

CHAT = {"messages": say("ok"), "max_tokens": 4}


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v1/chat/completions/", "/v1/chat/completions"),
        ("//v1/chat/completions", "/v1/chat/completions"),
        ("/v1//chat/./completions", "/v1/chat/completions"),
        ("/", "/"),
    ],
)
def test_route_path_normalizes_what_the_router_would_match(path: str, route: str) -> None:
    assert route_path(path) == route


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "//v1/chat/completions", "/chat//completions"])
def test_json_gate_holds_for_path_variants(path: str) -> None:
    with fake_client() as (client, _):
        r = client.post(path, content=b'{"messages": []}', headers={"Content-Type": "text/plain"})
        assert r.status_code == 415, (path, r.status_code, r.text)


def test_origin_null_passes_only_with_the_browsers_same_origin_marker() -> None:
    with fake_client() as (client, _):
        alone = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "null"})
        assert alone.status_code == 403
        for site in ("cross-site", "same-site", "none"):
            r = client.post(
                "/v1/chat/completions", json=CHAT, headers={"Origin": "null", "Sec-Fetch-Site": site}
            )
            assert r.status_code == 403, site
        same = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=same).status_code == 200


def test_deeply_nested_json_is_a_400_not_a_500() -> None:
    with fake_client() as (client, _):
        for depth in (65, 1000, 100_000):
            body = b'{"messages": ' + b"[" * depth + b"]" * depth + b"}"
            r = client.post(
                "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 400, (depth, r.text[:200])
            assert r.json()["error"]["code"] == "invalid_json"


def test_a_nul_byte_in_the_path_is_a_404(tmp_path: Path) -> None:
    settings = fake_settings(ui=True, home=str(tmp_path))
    with TestClient(create_app(settings, ModelManager(settings)), timeout=30) as client:
        for path in ("/static/x%00", "/static/app.js%00.png", "/v1/models%00"):
            r = client.get(path)
            assert r.status_code == 404, (path, r.status_code)


def test_loopback_is_decided_by_address() -> None:
    for host, loopback in [
        ("127.0.0.2", True),
        ("127.255.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.4", False),
        ("127.example.com", False),
    ]:
        assert is_loopback_host(host) is loopback, host
        assert Settings.load({"host": host, "api_key": "k"}, environ={}).is_loopback is loopback, host
        # No "reachable from other machines" warning for a loopback address without a key.
        warned = security_warning(Settings.load({"host": host}, environ={})) is not None
        assert warned is not loopback, host
    check = HostCheck(True)
    assert check.allows("127.0.0.2:8000") and check.allows("[::1]:1") and check.allows("localhost")
    assert not check.allows("127.0.0.2.evil.example") and not check.allows("evil.example")


def test_pages_and_assets_carry_the_security_headers(tmp_path: Path) -> None:
    settings = fake_settings(ui=True, home=str(tmp_path))
    with TestClient(create_app(settings, ModelManager(settings)), timeout=30) as client:
        page = client.get("/")
        # no-referrer would make Chromium send `Origin: null` on the login form's POST
        assert page.headers["referrer-policy"] == "same-origin"
        loading = client.get("/static/loading.html")
        assert loading.status_code == 200
        assert "script-src 'self'" in loading.headers["content-security-policy"]
        assert loading.headers["x-content-type-options"] == "nosniff"
        assert client.get("/static/vendor/update.sh").status_code == 404  # a script is no asset


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ("/v1/models?api_key=sk-123", "/v1/models?api_key=***"),
        ("/x?a=1&X-Api-Key=s3&b=2", "/x?a=1&X-Api-Key=***&b=2"),
        ("/x?token=abc;key=def", "/x?token=***;key=***"),
        ("/ui/models/catalog?q=llama", "/ui/models/catalog?q=llama"),
        ("/plain", "/plain"),
    ],
)
def test_access_log_redacts_keys_in_query_strings(target: str, shown: str) -> None:
    assert redact_query(target) == shown
    record = logging.LogRecord("uvicorn.access", 20, "", 0, '%s - "%s %s HTTP/%s" %d', None, None)
    record.args = ("127.0.0.1:5", "GET", target, "1.1", 401)
    assert RedactSecrets().filter(record)
    assert shown in record.getMessage()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.usefixtures("usual_umask")
def test_data_dir_is_created_private_and_a_loose_one_is_tightened_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = tmp_path / "fresh" / "localchat"
    monkeypatch.setenv("LOCALCHAT_HOME", str(fresh))
    assert paths.data_dir() == fresh and _mode(fresh) == 0o700

    loose = tmp_path / "loose"
    (loose / "logs").mkdir(parents=True)
    for p in (loose, loose / "logs"):
        p.chmod(0o755)
    for name in ("conversations.sqlite3", "logs/localchat.log"):
        (loose / name).write_text("x")
        (loose / name).chmod(0o644)
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours to change")
    outside.chmod(0o644)
    (loose / "link").symlink_to(outside)
    monkeypatch.setenv("LOCALCHAT_HOME", str(loose))
    with caplog.at_level(logging.WARNING, logger="localchat.paths"):
        paths.data_dir()
        paths.data_dir()
    assert _mode(loose) == 0o700 and _mode(loose / "logs") == 0o700
    assert _mode(loose / "conversations.sqlite3") == 0o600 and _mode(loose / "logs/localchat.log") == 0o600
    assert _mode(outside) == 0o644  # a link's target outside the dir is left alone
    said = [r.getMessage() for r in caplog.records if "readable by other users" in r.getMessage()]
    assert len(said) == 1 and str(loose) in said[0]


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """022: files are 0644 and directories 0755 unless the code asks for less."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.usefixtures("usual_umask")
def test_the_store_and_the_log_files_are_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localchat.chats.store import Store
    from localchat.logs import setup_logging

    store = Store(tmp_path / "db" / "conversations.sqlite3")
    store.list_conversations()
    try:
        names = sorted(p.name for p in (tmp_path / "db").iterdir())
        assert names == ["conversations.sqlite3", "conversations.sqlite3-shm", "conversations.sqlite3-wal"]
        assert all(_mode(p) == 0o600 for p in (tmp_path / "db").iterdir()), names
        assert _mode(tmp_path / "db") == 0o700
    finally:
        store.close()
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        log_file = setup_logging("info", to_stderr=False)
        assert log_file is not None and _mode(log_file) == 0o600
        handler: Any = next(h for h in root.handlers if hasattr(h, "doRollover"))
        logging.getLogger("localchat.test").info("before the rollover")
        handler.doRollover()
        assert _mode(log_file) == 0o600 and _mode(log_file.with_name(log_file.name + ".1")) == 0o600
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        root.setLevel(saved[0])
        for h in saved[1]:
            root.addHandler(h)


def test_desktop_sign_in_checks_host_and_a_wrong_token_burns_nothing() -> None:
    import httpx

    from localchat.desktop.gate import DesktopGate, DesktopHooks
    from localchat.desktop.server import BackgroundServer, bind_socket

    hooks = DesktopHooks(focus=lambda: None, set_serve_api=lambda _: None)
    never = threading.Event()

    def build(progress: Any) -> Any:
        never.wait(30)
        raise RuntimeError("not needed")

    gate = DesktopGate(build, api_key="k", signin_token="right", instance_token="i", hooks=hooks)
    server = BackgroundServer(gate, bind_socket("127.0.0.1", 0), "warning")
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        rebound = httpx.get(f"{base}/desktop/signin?token=right", headers={"Host": "evil.example"})
        assert rebound.status_code == 421
        assert httpx.post(f"{base}/desktop/focus", headers={"Host": "evil.example"}).status_code == 421
        assert httpx.get(f"{base}/desktop/signin?token=wrong").status_code == 403
        ok = httpx.get(f"{base}/desktop/signin?token=right", follow_redirects=False)
        assert ok.status_code == 303 and "localchat_api_key=k" in ok.headers["set-cookie"]
        assert httpx.get(f"{base}/desktop/signin?token=right").status_code == 403  # once only
    finally:
        never.set()
        server.stop()
