"""The desktop app end to end, each window in its own process: --selftest (window, loading page, sign-in,
a chat message typed into the page and its rendered answer, About dialog, close -> exit 0 and the port
freed), the per-launch key, single instance, SIGTERM, persisted window state, and the no-GUI fallback."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from localchat.chats.store import Store
from tests.desktop.conftest import (
    desktop_env,
    localchat,
    port_is_free,
    start_localchat,
    stop,
    wait_for_instance,
)

pytestmark = [pytest.mark.desktop, pytest.mark.timeout(300)]

PASSED = re.compile(
    r"selftest passed: window after ([\d.]+)s, chat UI usable after ([\d.]+)s.* on port (\d+)"
)


def _selftest(home: Path, display: str, *extra: str) -> re.Match[str]:
    done = localchat(["--selftest", "--backend", "fake", *extra], desktop_env(home, display))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    match = PASSED.search(output)
    assert match, output[-3000:]
    return match


@pytest.mark.parametrize("display", ["offscreen", "xvfb"])
def test_selftest_chats_through_the_window_and_frees_the_port(
    tmp_path: Path, display: str, request: pytest.FixtureRequest
) -> None:
    if display == "xvfb":
        display = request.getfixturevalue("xvfb_display")
    match = _selftest(tmp_path, display)
    assert port_is_free(int(match.group(3)))
    log = (tmp_path / "logs" / "localchat.log").read_text()
    assert "window shown" in log and "server stopped" in log and "clean: True" in log
    # The answer really went through the UI's own routes, and the test chat was deleted afterwards.
    assert "POST /ui/chats" in log
    assert "DELETE /ui/c/" in log
    store = Store(tmp_path / "conversations.sqlite3")
    try:
        assert store.list_conversations() == []
    finally:
        store.close()
    # Closing saved the window's geometry for the next launch.
    state = json.loads((tmp_path / "desktop.json").read_text())
    assert state["width"] >= 480 and state["height"] >= 360


def test_the_server_refuses_requests_without_the_per_launch_key(tmp_path: Path) -> None:
    env = desktop_env(tmp_path, "offscreen", LOCALCHAT_API_KEY="the-configured-key")
    proc = start_localchat(["--backend", "fake"], env)
    try:
        info = wait_for_instance(tmp_path, proc)
        base = f"http://127.0.0.1:{info['port']}"
        assert info["port"] != 8000  # an OS-picked port, not the configured one
        assert httpx.get(f"{base}/health").status_code == 200  # public, like the server's
        assert httpx.get(f"{base}/v1/models").status_code == 401
        # The configured key only counts once "serve the API" is on: nobody outside the window has a key.
        configured = {"Authorization": "Bearer the-configured-key"}
        assert httpx.get(f"{base}/v1/models", headers=configured).status_code == 401
        assert httpx.get(f"{base}/", follow_redirects=False).status_code in (303, 401)
        # The one-time sign-in token was used by the window; guessing or replaying it gets nothing.
        replay = httpx.get(f"{base}/desktop/signin?token=anything", follow_redirects=False)
        assert replay.status_code == 403 and "set-cookie" not in replay.headers
        # Only this user may read the instance file (it holds the focus secret).
        assert stat.S_IMODE((tmp_path / "desktop-instance.json").stat().st_mode) == 0o600
    finally:
        out = stop(proc)
    assert proc.returncode == 0, out[-3000:]
    assert port_is_free(int(info["port"]))


def test_a_second_launch_focuses_the_first_and_exits(tmp_path: Path) -> None:
    env = desktop_env(tmp_path, "offscreen")
    first = start_localchat(["--backend", "fake"], env)
    try:
        wait_for_instance(tmp_path, first)
        started = time.monotonic()
        second = localchat(["--backend", "fake"], env, timeout_s=60)
        assert second.returncode == 0, second.stderr[-2000:]
        assert "already running" in second.stderr
        assert time.monotonic() - started < 30
        assert first.poll() is None  # the first one keeps running
        log = (tmp_path / "logs" / "localchat.log").read_text()
        assert "another launch asked for the window" in log
        # A stranger without the instance secret cannot poke the window.
        port = json.loads((tmp_path / "desktop-instance.json").read_text())["port"]
        assert httpx.post(f"http://127.0.0.1:{port}/desktop/focus").status_code == 403
    finally:
        out = stop(first)
    assert first.returncode == 0, out[-3000:]
    assert not (tmp_path / "desktop-instance.json").exists()


def test_window_size_and_position_come_back_at_the_next_launch(tmp_path: Path) -> None:
    (tmp_path / "desktop.json").write_text(json.dumps({"width": 1003, "height": 707, "x": 40, "y": 30}))
    _selftest(tmp_path, "offscreen")
    state = json.loads((tmp_path / "desktop.json").read_text())
    assert (state["width"], state["height"]) == (1003, 707)


def test_no_display_falls_back_to_the_browser_and_says_why(tmp_path: Path) -> None:
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    with socket.socket() as sock:  # a free port for the browser mode's fixed-port server
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = desktop_env(tmp_path, "none", BROWSER=str(browser), LOCALCHAT_PORT=str(port))
    proc = start_localchat(["--backend", "fake"], env)
    try:
        deadline = time.monotonic() + 60
        while not opened.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert opened.exists(), "the browser was not opened"
        while time.monotonic() < deadline:  # stop it once it serves (not mid-start-up)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
    finally:
        out = stop(proc)
    assert "cannot open the desktop window: there is no display" in out
    assert "opening the web UI in your browser instead" in out
    assert opened.read_text().strip() == f"http://127.0.0.1:{port}/"
    assert proc.returncode == 0


def test_missing_pywebview_names_the_package_to_install(tmp_path: Path) -> None:
    # The import fails for real (a None entry in sys.modules), as it does where pywebview is absent.
    code = (
        "import sys; sys.modules['webview'] = None\n"
        "from localchat.desktop.app import gui_problem; print(gui_problem())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=desktop_env(tmp_path, "offscreen"), capture_output=True, text=True
    )
    assert "pywebview is not installed" in done.stdout
    assert "pip install 'localchat-app[desktop]'" in done.stdout


def test_serve_the_api_uses_the_configured_port_and_key(tmp_path: Path) -> None:
    (tmp_path / "desktop.json").write_text(json.dumps({"serve_api": True}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = desktop_env(tmp_path, "offscreen", LOCALCHAT_PORT=str(port), LOCALCHAT_API_KEY="k-configured")
    proc = start_localchat(["--backend", "fake"], env)
    try:
        info = wait_for_instance(tmp_path, proc)
        assert info["port"] == port
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/v1/models").status_code == 401
        models = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer k-configured"})
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "fake-model"
    finally:
        out = stop(proc)
    assert proc.returncode == 0, out[-3000:]
