"""The desktop window runs in a child process per test (Qt cannot start twice in one process), killed by
a watchdog if it hangs. Displays: Qt's offscreen platform, or a real X server (Xvfb)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def desktop_env(home: Path, display: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    env.pop("QT_QPA_PLATFORM", None)
    env.update(LOCALCHAT_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    if display == "offscreen":
        env["QT_QPA_PLATFORM"] = "offscreen"
    elif display != "none":
        env["DISPLAY"] = display
    return env


@pytest.fixture(scope="session")
def xvfb_display() -> Iterator[str]:
    """A private Xvfb server for the session (skipped where Debian's xvfb is not installed)."""
    if shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed (apt install xvfb)")
    number = 90 + os.getpid() % 100
    proc = subprocess.Popen(
        ["Xvfb", f":{number}", "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    socket_path = Path(f"/tmp/.X11-unix/X{number}")
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"Xvfb :{number} did not start")
        time.sleep(0.05)
    yield f":{number}"
    proc.terminate()
    proc.wait(10)


def localchat(
    args: list[str], env: dict[str, str], timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run `python -m localchat ARGS` to the end; the watchdog kills a hung window."""
    return subprocess.run(
        [sys.executable, "-m", "localchat", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def start_localchat(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "localchat", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_instance(home: Path, proc: subprocess.Popen[str], timeout_s: float = 90) -> dict[str, int | str]:
    """The running app's published port and instance secret, once its model is ready (/health 200)."""
    deadline = time.monotonic() + timeout_s
    info_file = home / "desktop-instance.json"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the app exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        if info_file.exists():
            info = json.loads(info_file.read_text())
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{info['port']}/health", timeout=2).status_code == 200:
                    return info
        time.sleep(0.1)
    stop(proc)
    pytest.fail("the app did not get ready in time")


def stop(proc: subprocess.Popen[str], timeout_s: float = 30) -> str:
    """SIGTERM (what a desktop session sends at logout) and collect the output."""
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the app did not exit after SIGTERM: {out[-2000:]}")
    return out


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0
