"""What the desktop app keeps on disk: its window state file, its single-instance lock, its log file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from localchat.desktop.instance import INFO_FILE, InstanceLock, focus_running
from localchat.desktop.state import STATE_FILE, DesktopState
from localchat.logs import setup_logging


def test_state_round_trips_and_survives_a_damaged_file(tmp_path: Path) -> None:
    assert DesktopState.load(tmp_path) == DesktopState()
    DesktopState(width=900, height=600, x=10, y=20, serve_api=True).save(tmp_path)
    assert DesktopState.load(tmp_path) == DesktopState(900, 600, 10, 20, True)
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]  # no temporary file left behind
    (tmp_path / STATE_FILE).write_text("{not json")
    assert DesktopState.load(tmp_path) == DesktopState()
    (tmp_path / STATE_FILE).write_text(json.dumps({"width": 5, "height": "big", "serve_api": "yes"}))
    assert DesktopState.load(tmp_path) == DesktopState(width=480)  # clamped; wrong types ignored


def test_only_one_instance_holds_the_lock(tmp_path: Path) -> None:
    first, second = InstanceLock(tmp_path), InstanceLock(tmp_path)
    assert first.acquire()
    assert not second.acquire()
    first.publish(1, "secret")
    assert json.loads((tmp_path / INFO_FILE).read_text())["port"] == 1
    first.release()
    assert not (tmp_path / INFO_FILE).exists()
    assert second.acquire()
    second.release()


def test_focus_gives_up_when_nobody_answers(tmp_path: Path) -> None:
    lock = InstanceLock(tmp_path)
    assert lock.acquire()
    lock.publish(9, "secret")  # port 9 (discard): nothing listens
    try:
        assert focus_running(tmp_path, wait_s=0.3) is False
    finally:
        lock.release()


def test_logs_go_to_a_rotating_file_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        path = setup_logging("info")
        setup_logging("info")  # twice: still one file handler
        assert path == tmp_path / "logs" / "localchat.log"
        assert sum(isinstance(h, logging.FileHandler) for h in root.handlers) == 1
        logging.getLogger("localchat.test").info("hello from the test")
        for handler in root.handlers:
            handler.flush()
        assert "hello from the test" in path.read_text()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved[1]
        root.setLevel(saved[0])
