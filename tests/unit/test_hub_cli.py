"""`localchat pull | list | rm | verify` and `--m ORG/REPO` on serve/chat, in-process against the fake hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localchat.cli import main as cli
from localchat.cli.models import ProgressPrinter, format_table, render
from localchat.hub import PullProgress
from localchat.hub.records import LocalModel
from tests.helpers.fake_hub import FakeHub
from tests.helpers.live_server import free_port, live_server

DATA = os.urandom(200_000)


@pytest.fixture
def repo(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add_repo("org/Cli-GGUF", {"cli-Q4_K_M.gguf": DATA, "cli-Q8_0.gguf": DATA + b"8"})
    return fake_hub


def test_pull_list_verify_rm(
    repo: FakeHub, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALCHAT_PORT", str(free_port()))  # no server there: no LOADED column
    assert cli.main(["pull", "org/Cli-GGUF:q8_0"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().endswith("cli-Q8_0.gguf")
    assert err.splitlines()[0].startswith("resolving") and "done: org/Cli-GGUF:Q8_0 is at" in err
    assert cli.main(["list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "REPO", "QUANT", "SIZE", "WHERE", "STATUS"]
    assert table[1].split()[:4] == ["org/Cli-GGUF:Q8_0", "org/Cli-GGUF", "Q8_0", "200.0"]
    assert "localchat:" in table[1] and table[1].endswith("complete")
    # With a localchat serving on that port, it is asked what it has loaded.
    with live_server(["--backend", "fake"]) as server:
        assert cli.main(["list", "--p", str(server.port)]) == 0
        table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "REPO", "QUANT", "SIZE", "WHERE", "LOADED", "STATUS"]
    assert table[1].split()[-2:] == ["no", "complete"]  # the fake model is what it has loaded
    assert cli.main(["verify", "org/Cli-GGUF:Q8_0"]) == 0
    assert "checksums match" in capsys.readouterr().out
    assert cli.main(["rm", "org/Cli-GGUF:Q8_0"]) == 0
    assert "200.0 KB freed" in capsys.readouterr().out
    assert cli.main(["verify", "org/Cli-GGUF:Q8_0"]) == 1
    assert cli.main(["list"]) == 0
    assert "No models yet" in capsys.readouterr().out


def test_errors_are_one_readable_line(repo: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["pull", "org/Cli-GGUF:Q2_K"]) == 1
    err = capsys.readouterr().err
    assert "localchat: error: org/Cli-GGUF has no GGUF file for 'Q2_K'. Available quants: Q4_K_M" in err
    assert cli.main(["rm", "org/Never-GGUF"]) == 1
    assert "not on this machine" in capsys.readouterr().err


def test_model_flag_pulls_a_missing_model_first(repo: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    from localchat.hub import find_local

    _, _, settings = cli.parse_settings(["serve", "--m", "org/Cli-GGUF"], environ={})
    cli._pull_model_flag(settings)
    assert find_local("org/Cli-GGUF") is not None and "done:" in capsys.readouterr().err
    repo.log.clear()
    cli._pull_model_flag(settings)  # already there: no request at all
    assert repo.log == []


def test_progress_bar_on_a_terminal() -> None:
    event = PullProgress("downloading", "x", "m-Q4_K_M.gguf", 250_000_000, 500_000_000, 25_000_000.0, 10.0)
    line = render(event)
    assert line.split() == ["downloading", "m-Q4_K_M.gguf", "[##########----------]", "50%", "250.0", "MB", "/",
                            "500.0", "MB", "25.0", "MB/s", "ETA", "0:10"]  # fmt: skip

    class Tty:
        text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return True

    stream = Tty()
    printer = ProgressPrinter(stream)  # type: ignore[arg-type]
    printer(event)
    printer(PullProgress("done", "x", None, 1, 1, 0.0, None, "x is at /p"))
    assert stream.text == "\r\033[K" + line + "\r\033[Kdone: x is at /p\n"
    assert "No models yet" in format_table([])


def test_the_loaded_column_matches_a_models_name_repo_or_file() -> None:
    gguf = LocalModel("smollm2-135m", None, "Q4_1", "gguf", Path("/m/SmolLM2-135M-Instruct.Q4_1.gguf"))
    other = LocalModel("org/Other-GGUF:Q8_0", "org/Other-GGUF", "Q8_0", "gguf", Path("/m/other.gguf"))
    rows = format_table([gguf, other], {"SmolLM2-135M-Instruct.Q4_1"}).splitlines()
    assert rows[1].split()[-2:] == ["yes", "complete"] and rows[2].split()[-2:] == ["no", "complete"]
    assert "LOADED" not in format_table([gguf], None)
