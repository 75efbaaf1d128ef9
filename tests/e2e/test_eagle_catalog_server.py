"""`eagle:` in models.yaml end to end: `localchat pull ALIAS` fetches the tiny model and its EAGLE-3 head
from the fake hub, then `localchat serve --m ALIAS --speculative eagle` runs offline with that head (no
--draft-model): the answer is plain decoding's and /metrics counts the head's drafts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localchat.cli import main as cli
from tests.backends.test_speculative_eagle3_llm import random_eagle_head
from tests.e2e.test_speculative_draft_server import QUESTION
from tests.helpers.fake_hub import FakeHub
from tests.helpers.live_server import live_server
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow


def chat_and_drafts(args: list[str], env: dict[str, str]) -> tuple[str, float]:
    with live_server(args, env=env) as server, server.client() as client:
        reply = client.post("/v1/chat/completions", json=QUESTION)
        assert reply.status_code == 200, reply.text
        metrics = client.get("/metrics").text
    drafts = [
        line.split()[1]
        for line in metrics.splitlines()
        if line.startswith("localchat_spec_draft_tokens_total")
    ]
    return str(reply.json()["choices"][0]["message"]["content"]), float(drafts[0])


def test_a_catalog_head_is_pulled_and_serves_offline(fake_hub: FakeHub, tmp_path: Path) -> None:
    cfg = tiny_config()
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=3), cfg, qtype="F32")
    head = random_eagle_head(tmp_path / "head", cfg["hidden_size"], TINY_VOCAB_SIZE, aux_layers=[0, 1, 2])
    fake_hub.add_repo("org/Tiny-GGUF", {"tiny.gguf": model})
    fake_hub.add_repo("org/Tiny-EAGLE3", {p.name: p for p in head.iterdir()})
    home = Path(os.environ["LOCALCHAT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.yaml").write_text(
        "models:\n  tiny-eagle:\n    repo_id: org/Tiny-GGUF\n    file: tiny.gguf\n    eagle: org/Tiny-EAGLE3\n"
    )
    assert cli.main(["pull", "tiny-eagle"]) == 0
    pulled = len(fake_hub.log)
    env = {"LOCALCHAT_HOME": str(home), "HF_HUB_OFFLINE": "1", "LOCALCHAT_TORCH_QUANT": "dequant"}
    args = [
        "--m",
        "tiny-eagle",
        "--backend",
        "torch",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--threads",
        "1",
    ]
    plain, no_drafts = chat_and_drafts(args, env)
    answer, drafts = chat_and_drafts([*args, "--speculative", "eagle"], env)
    assert answer == plain and no_drafts == 0 and drafts > 0
    assert len(fake_hub.log) == pulled  # the server found both on disk
