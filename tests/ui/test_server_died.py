"""The server dies in the middle of an answer (a real `localchat serve` process, killed): the chat page
says so with a Retry button; Retry while it is down says it still cannot reach it; once the server is
back on the same port and data dir, Retry shows the answer as interrupted, ready to regenerate."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localchat.chats.conversations import INTERRUPTED
from tests.helpers.live_server import REPO, free_port
from tests.ui.actions import send_new_chat
from tests.ui.conftest import WIDE

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = [pytest.mark.browser, pytest.mark.slow]


class Server:
    """`localchat serve` on the fake backend, restartable on the same port and data dir."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="localchat-died-", suffix=".log")[1])

    def start(self) -> None:
        cmd = [sys.executable, "-m", "localchat", "serve", "--p", str(self.port), "--backend", "fake"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, "--log", "warning"],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "LOCALCHAT_HOME": str(self.home)},
            )
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # no shutdown hooks: what a crash or an OOM kill looks like
            self.proc.wait(10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(tmp_path / "home")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_a_server_that_dies_mid_answer_is_shown_with_retry(browser: Any, server: Server):
    context = browser.new_context(base_url=server.url, viewport=WIDE)
    context.set_default_timeout(15_000)
    page = context.new_page()
    # Console errors are expected here (the refused stream); script errors are not.
    script_errors: list[str] = []
    page.on("pageerror", lambda exc: script_errors.append(str(exc)))
    try:
        send_new_chat(page, "<<slow:150>>Tell me something long.")
        answer = page.locator("#messages .msg.assistant").last
        expect(answer.locator(".answer")).not_to_be_empty()  # the answer is being written
        expect(answer).to_have_attribute("data-status", "streaming")
        server.kill()

        notice = page.locator("#notice .stream-lost")
        expect(notice).to_be_visible()
        expect(notice).to_contain_text("broke in the middle of this answer")
        retry = notice.get_by_role("button", name="Retry")
        retry.click()
        expect(notice).to_contain_text("still cannot be reached")

        server.start()
        notice.get_by_role("button", name="Retry").click()
        answer = page.locator("#messages .msg.assistant").last
        expect(answer).to_have_attribute("data-status", "error")
        expect(answer.locator(".msg-error")).to_contain_text(INTERRUPTED)
        expect(answer.get_by_role("button", name="Regenerate the answer")).to_be_visible()
        expect(page.locator("#notice .stream-lost")).to_have_count(0)
        assert not script_errors, script_errors
    finally:
        context.close()
