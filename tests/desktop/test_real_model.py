"""The desktop app on the real small model, whose load takes seconds: the loading page is what the
window shows meanwhile, and closing the window during the load still exits cleanly."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.desktop.conftest import desktop_env, localchat, start_localchat, stop

pytestmark = [pytest.mark.desktop, pytest.mark.slow, pytest.mark.timeout(600)]


def test_selftest_on_the_real_model_shows_the_loading_page_first(tmp_path: Path, smollm2_gguf: Path) -> None:
    done = localchat(
        ["--selftest", "--f", str(smollm2_gguf)], desktop_env(tmp_path, "offscreen"), timeout_s=500
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "selftest passed" in done.stdout
    log = (tmp_path / "logs" / "localchat.log").read_text()
    signin_at = log.index('"GET /desktop/signin?token=')
    before = log[:signin_at]
    # The loading page was on screen: it fetched its script and polled /health, which said "not yet".
    assert '"GET /static/loading.js HTTP/1.1" 200' in before
    assert re.search(r'"GET /health HTTP/1.1" 503', before)
    assert '"GET / HTTP/1.1" 200' in log[signin_at:]


def test_closing_the_window_during_the_model_load_exits_cleanly(tmp_path: Path, smollm2_gguf: Path) -> None:
    proc = start_localchat(["--f", str(smollm2_gguf)], desktop_env(tmp_path, "offscreen"))
    log = tmp_path / "logs" / "localchat.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and "window shown" in log.read_text()):
        time.sleep(0.2)
    assert "model SmolLM2" not in log.read_text(), "the model loaded too fast for this test"
    started = time.monotonic()
    out = stop(proc)
    assert proc.returncode == 0, out[-3000:]
    assert time.monotonic() - started < 20  # the load is abandoned, not waited for
