"""`localchat serve --speculative draft --draft-model FILE`: the draft loads beside the target, the answer
is the one plain decoding gives, and /metrics counts the drafts; a draft with another vocabulary stops
the start-up with one line naming both models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.live_server import REPO, live_server, server_args
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow

QUESTION = {
    "messages": [{"role": "user", "content": "Say something about drafts."}],
    "max_tokens": 24,
    "temperature": 0,
}


def _chat_and_metrics(args: list[str]) -> tuple[str, dict[str, float]]:
    with live_server(args) as server, server.client() as client:
        reply = client.post("/v1/chat/completions", json=QUESTION)
        assert reply.status_code == 200, reply.text
        metrics = client.get("/metrics").text
    values = {}
    for line in metrics.splitlines():
        if line.startswith("localchat_spec") or line.startswith("localchat_tokens_per_target_pass"):
            name, value = line.split()
            values[name] = float(value)
    return str(reply.json()["choices"][0]["message"]["content"]), values


def test_a_draft_model_server_answers_like_plain_decoding(tmp_path: Path) -> None:
    cfg = tiny_config()
    weights = random_state_dict(cfg, seed=3)
    # A sharp output layer: the draft is sure of its guesses (a random model spreads its mass, and the
    # draft stops at any guess under p_min = 0.75).
    weights["lm_head.weight"] *= 100
    model = write_tiny_gguf(tmp_path / "tiny.gguf", weights, cfg, qtype="F32")
    args = [*server_args("torch", model), "--device", "cpu", "--threads", "1"]
    plain, plain_metrics = _chat_and_metrics(args)
    assert plain and plain_metrics["localchat_spec_draft_tokens_total"] == 0
    # The target as its own draft: exact, and nearly every draft kept.
    drafted, metrics = _chat_and_metrics([*args, "--speculative", "draft", "--draft-model", str(model)])
    assert drafted == plain
    assert metrics["localchat_spec_draft_tokens_total"] > 0
    assert metrics["localchat_spec_acceptance_rate"] > 0.9
    assert metrics["localchat_tokens_per_target_pass"] > 2


def test_a_draft_with_another_vocabulary_is_refused_naming_both(tmp_path: Path) -> None:
    cfg = tiny_config()
    target = write_tiny_gguf(tmp_path / "target.gguf", random_state_dict(cfg), cfg, qtype="F32")
    other = write_tiny_gguf(
        tmp_path / "other.gguf", random_state_dict(cfg), cfg, qtype="F32", tokenizer_kind="llama"
    )
    draft = ["--speculative", "draft", "--draft-model", str(other)]
    run = subprocess.run(
        [sys.executable, "-m", "localchat", "serve", *server_args("torch", target), "--p", "0", *draft],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "LOCALCHAT_HOME": str(tmp_path)},
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert "The draft model other cannot speculate for target: token" in run.stderr, run.stderr
