"""A models.yaml entry's `eagle:` names an EAGLE-3 head repo: `localchat pull ALIAS` brings the head with
the model (fake hub), and the serving side picks it as the `--speculative eagle` head when no
--draft-model is given (tests/e2e/test_eagle_catalog_server.py serves with it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localchat.cli import main as cli
from localchat.config import Settings
from localchat.hub import pull_eagle_head
from localchat.models.catalog import CatalogEntry, ResolvedModel
from localchat.models.pulls import Pulls
from localchat.serving.draft_model import draft_model_name
from tests.helpers.fake_hub import FakeHub

MODEL = os.urandom(50_000)
HEAD: dict[str, bytes | Path] = {
    "config.json": b'{"architectures": ["LlamaForCausalLMEagle3"]}',
    "model.safetensors": os.urandom(20_000),
}
CATALOG = """models:
  tiny-eagle:
    repo_id: org/Tiny-GGUF
    file: tiny.gguf
    eagle: org/Tiny-EAGLE3
  tiny-plain:
    repo_id: org/Tiny-GGUF
    file: tiny.gguf
"""


@pytest.fixture
def home(fake_hub: FakeHub) -> Path:
    fake_hub.add_repo("org/Tiny-GGUF", {"tiny.gguf": MODEL})
    fake_hub.add_repo("org/Tiny-EAGLE3", HEAD)
    home = Path(os.environ["LOCALCHAT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.yaml").write_text(CATALOG)
    return home


def test_the_entry_reads_the_eagle_field() -> None:
    entry = CatalogEntry.from_dict("m", {"repo_id": "org/M-GGUF", "eagle": "org/M-EAGLE3"})
    assert entry.eagle == "org/M-EAGLE3"
    assert CatalogEntry.from_dict("m", {"repo_id": "org/M-GGUF"}).eagle is None


def test_pull_brings_the_head_with_the_model(
    home: Path, fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["pull", "tiny-eagle"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("tiny.gguf") and Path(lines[0]).read_bytes() == MODEL
    assert lines[1].startswith("EAGLE-3 head: ")
    folder = Path(lines[1].removeprefix("EAGLE-3 head: "))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert (folder / "model.safetensors").read_bytes() == HEAD["model.safetensors"]
    # Both are local now: pulling again asks the hub nothing.
    before = len(fake_hub.log)
    assert cli.main(["pull", "tiny-eagle"]) == 0
    assert len(fake_hub.log) == before


def test_an_entry_without_a_head_pulls_only_the_model(home: Path, fake_hub: FakeHub) -> None:
    assert cli.main(["pull", "tiny-plain"]) == 0
    assert pull_eagle_head("tiny-plain") is None
    assert pull_eagle_head("org/Tiny-GGUF:tiny.gguf") is None  # not a catalog entry
    assert not fake_hub.requests(path_contains="Tiny-EAGLE3")


def test_serving_takes_the_entrys_head_unless_draft_model_names_one(home: Path) -> None:
    target = ResolvedModel(home / "tiny.gguf", "tiny-eagle")
    settings = Settings(model="tiny-eagle", speculative="eagle")
    assert draft_model_name(settings, target, "eagle") == "org/Tiny-EAGLE3"
    assert draft_model_name(settings, target) is None  # no `draft:` in the entry
    chosen = Settings(model="tiny-eagle", speculative="eagle", draft_model="/heads/mine")
    assert draft_model_name(chosen, target, "eagle") == "/heads/mine"
    plain = ResolvedModel(home / "tiny.gguf", "tiny-plain")
    assert draft_model_name(Settings(model="tiny-plain"), plain, "eagle") is None


def test_the_servers_pulls_bring_the_head_too(home: Path, fake_hub: FakeHub) -> None:
    job = Pulls(home).start("tiny-eagle")
    assert job.done.wait(30) and job.error is None and job.progress["phase"] == "done"
    assert fake_hub.requests(path_contains="Tiny-EAGLE3")
    before = len(fake_hub.log)
    assert pull_eagle_head("tiny-eagle") is not None  # already on disk: no request
    assert len(fake_hub.log) == before
