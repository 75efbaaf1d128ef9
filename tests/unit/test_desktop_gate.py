"""The desktop's server before and after its model is ready, over real HTTP (uvicorn on a thread, the
fake backend): the loading page and its /health progress, the one-time sign-in, the desktop routes."""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from localchat.config import Settings
from localchat.desktop.gate import LOADING_PAGE, DesktopGate, DesktopHooks, Progress
from localchat.desktop.server import BackgroundServer, bind_socket
from localchat.errors import ModelLoadError

KEY = "per-launch-key"
SIGNIN = "one-time-token"
INSTANCE = "instance-secret"


@dataclass
class Harness:
    gate: DesktopGate
    base: str
    release: threading.Event
    focused: list[bool] = field(default_factory=list)
    serve_api: list[bool] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    release = threading.Event()
    failure: list[Exception] = []

    def build(progress: Progress) -> Any:
        # A load that takes as long as the test wants, reporting progress like the model fetch does.
        from localchat.server.app import create_app
        from localchat.serving.assembly import build_context

        progress.model = "fake-model"
        progress.say("Fetching smollm2-135m (105 MiB) from PyPI ...")
        release.wait(30)
        if failure:
            raise failure[0]
        settings = Settings.load({"backend": "fake", "kv_cache_mib": 2, "api_key": KEY}, environ={})
        return create_app(settings, build_context(settings))

    focused: list[bool] = []
    serve_api: list[bool] = []
    reports: list[dict[str, Any]] = []
    hooks = DesktopHooks(
        focus=lambda: focused.append(True), set_serve_api=serve_api.append, report=reports.append
    )
    gate = DesktopGate(build, api_key=KEY, signin_token=SIGNIN, instance_token=INSTANCE, hooks=hooks)
    server = BackgroundServer(gate, bind_socket("127.0.0.1", 0), "warning")
    server.start()
    h = Harness(gate, f"http://127.0.0.1:{server.port}", release, focused, serve_api, reports)
    h.failure = failure  # type: ignore[attr-defined]
    try:
        yield h
    finally:
        release.set()
        assert server.stop()


def _health_when(base: str, done: Any) -> httpx.Response:
    for _ in range(200):  # the load runs on its own thread: give it a moment to report
        health = httpx.get(f"{base}/health")
        if done(health.json()):
            break
        threading.Event().wait(0.05)
    return health


def test_while_loading_the_page_and_health_report_progress(harness: Harness) -> None:
    health = _health_when(harness.base, lambda b: b.get("model"))
    assert health.status_code == 503
    body = health.json()
    assert body["status"] == "loading" and body["model"] == "fake-model"
    assert body["progress"]["message"].startswith("Fetching smollm2-135m")
    assert set(body["progress"]) == {"phase", "done_bytes", "total_bytes", "speed_bps", "eta_s", "message"}
    # A page request lands on the loading page, which passes the UI's CSP (no inline script).
    page = httpx.get(f"{harness.base}/", headers={"accept": "text/html"}, follow_redirects=True)
    assert page.status_code == 200 and str(page.url).endswith(LOADING_PAGE)
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page.text)
    assert httpx.get(f"{harness.base}/static/loading.js").status_code == 200
    assert httpx.get(f"{harness.base}/static/%2e%2e/%2e%2e/pyproject.toml").status_code == 404
    # The API says what is going on instead of hanging or dropping the request.
    api = httpx.get(f"{harness.base}/v1/models")
    assert api.status_code == 503 and api.json()["error"]["code"] == "model_loading"
    assert harness.gate.loading_seen.is_set()


def test_once_loaded_the_window_signs_in_once_and_the_key_guards_everything(harness: Harness) -> None:
    harness.release.set()
    assert harness.gate.ready.wait(30)
    assert httpx.get(f"{harness.base}/health").json()["status"] == "ok"
    assert httpx.get(f"{harness.base}/v1/models").status_code == 401
    with httpx.Client(base_url=harness.base) as window:
        signin = window.get(f"/desktop/signin?token={SIGNIN}", follow_redirects=False)
        assert signin.status_code == 303 and signin.headers["location"] == "/"
        cookie = signin.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age" not in cookie
        assert window.get("/").status_code == 200  # the chat UI, signed in by the cookie
        assert window.get("/v1/models").status_code == 200
        assert "Log file" in window.get("/ui/about").text
        saved = window.post("/desktop/settings", data={"serve_api": "on"})
        assert saved.status_code == 200 and harness.serve_api == [True]
        assert window.post("/desktop/report", json={"kind": "probe"}).status_code == 204
        assert harness.reports == [{"kind": "probe"}]
        assert window.post("/desktop/report", content=b"not json").status_code == 400
        assert window.post("/desktop/settings", content=b"x" * 100_000).status_code == 413
    # The token worked once; a replay (or a stranger) gets no cookie.
    replay = httpx.get(f"{harness.base}/desktop/signin?token={SIGNIN}", follow_redirects=False)
    assert replay.status_code == 403 and "set-cookie" not in replay.headers
    assert httpx.post(f"{harness.base}/desktop/settings", data={"serve_api": "on"}).status_code == 401
    assert harness.serve_api == [True]


def test_focus_needs_the_instance_secret(harness: Harness) -> None:
    assert httpx.post(f"{harness.base}/desktop/focus").status_code == 403
    wrong = {"x-localchat-instance": secrets.token_urlsafe(8)}
    assert httpx.post(f"{harness.base}/desktop/focus", headers=wrong).status_code == 403
    ok = httpx.post(f"{harness.base}/desktop/focus", headers={"x-localchat-instance": INSTANCE})
    assert ok.status_code == 204 and harness.focused == [True]


def test_a_failed_load_is_reported_on_health_for_the_loading_page(harness: Harness) -> None:
    harness.failure.append(ModelLoadError("The file is not a GGUF model. Pass another with --f."))  # type: ignore[attr-defined]
    harness.release.set()
    body = _health_when(harness.base, lambda b: b["status"] == "error").json()
    assert body == {"status": "error", "detail": "The file is not a GGUF model. Pass another with --f."}
