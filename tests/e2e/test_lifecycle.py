"""Process-level behaviour of `localchat serve` and `localchat chat` (fake backend: about the server,
not the model): graceful SIGINT/SIGTERM, the exposure warning, the terminal chat."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.helpers.deadline import wait_until
from tests.helpers.live_server import REPO, check_chat_stream, live_server, parse_sse

pytestmark = pytest.mark.slow

SLOW_REPLY = "one two three four five six"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_lets_in_flight_requests_finish_then_exits_0(sig):
    with live_server(["--backend", "fake"]) as server:
        result: dict[str, bytes] = {}
        body = {"messages": [{"role": "user", "content": f"<<slow:60>><<say:{SLOW_REPLY}>>"}], "stream": True}

        def stream() -> None:
            with (
                httpx.Client(timeout=60) as c,
                c.stream("POST", server.api_url + "/chat/completions", json=body) as r,
            ):
                result["raw"] = r.read()

        reader = threading.Thread(target=stream)
        reader.start()
        wait_until(lambda: server.metrics()["localchat_requests_running"] >= 1, 10, "the stream is running")
        server.proc.send_signal(sig)

        def refused() -> bool:
            try:
                httpx.get(server.base_url + "/health", timeout=2)
            except httpx.HTTPError:
                return True
            return False

        wait_until(refused, 10, "no new connections once shutdown began")
        reader.join(30)
        assert server.proc.wait(30) == 0, server.log()
        # The in-flight stream ran to its natural end, not cut off.
        result_stream = check_chat_stream(parse_sse(result["raw"]))
        assert result_stream["texts"] == [SLOW_REPLY] and result_stream["reasons"] == {0: "stop"}


def test_exposed_without_key_warns_loudly():
    with live_server(["--backend", "fake", "--host", "0.0.0.0"]) as server:
        assert server.healthy()
    assert "NO API KEY" in server.log()
    with live_server(["--backend", "fake", "--host", "0.0.0.0", "--api-key", "k"]) as server:
        assert server.healthy()
    assert "NO API KEY" not in server.log()


def test_terminal_chat_one_shot_local_and_remote():
    local = subprocess.run(
        [
            sys.executable,
            "-m",
            "localchat",
            "chat",
            "--backend",
            "fake",
            "--mem",
            "1",
            "--log",
            "warning",
            "--message",
            "<<say:local **reply**>>",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert local.returncode == 0, local.stderr
    assert local.stdout == "local **reply**\n"
    with live_server(["--backend", "fake"], api_key="sekret") as server:
        remote = subprocess.run(
            [
                sys.executable,
                "-m",
                "localchat",
                "chat",
                "--url",
                server.api_url,
                "--api-key",
                "sekret",
                "--message",
                "<<say:from afar>>",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert remote.returncode == 0, remote.stderr
        assert remote.stdout == "from afar\n"
        denied = subprocess.run(
            [sys.executable, "-m", "localchat", "chat", "--url", server.api_url, "--message", "x"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert denied.returncode == 1 and "401" in denied.stderr


def test_terminal_chat_repl_keeps_history():
    # Piped stdin (not a TTY): plain text, one reply per line read. The fake model obeys the *first*
    # <<say:>> in its prompt, so a second turn answered "first" proves the history was sent; /reset drops it
    # (once confirmed).
    script = "<<say:first>>\n<<say:second>>\n/reset\ny\n<<say:third>>\n/exit\n"
    run = subprocess.run(
        [sys.executable, "-m", "localchat", "chat", "--backend", "fake", "--mem", "1", "--log", "warning"],
        input=script,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    stdout = re.sub(r"Forget the \d+ messages of this conversation\? \[y/N\] ", "", run.stdout)
    replies = [re.sub(r"^(>>> )+", "", line) for line in stdout.splitlines() if line.strip(" >")]
    assert replies == ["first", "first", "third"]
