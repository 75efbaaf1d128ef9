"""`localchat serve --speculative eagle --draft-model FOLDER`: an EAGLE-3 head attaches to the target, the
answer is the one plain decoding gives and /metrics counts its drafts; a head trained for another hidden
size stops the start-up with one line saying what does not fit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.test_speculative_eagle3_llm import random_eagle_head
from tests.e2e.test_speculative_draft_server import _chat_and_metrics
from tests.helpers.live_server import REPO, server_args
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow


def test_an_eagle3_server_answers_like_plain_decoding(tmp_path: Path) -> None:
    cfg = tiny_config()
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=3), cfg, qtype="F32")
    head = random_eagle_head(tmp_path / "head", cfg["hidden_size"], TINY_VOCAB_SIZE, aux_layers=[0, 1, 2])
    args = [*server_args("torch", model), "--device", "cpu", "--threads", "1"]
    plain, _ = _chat_and_metrics(args)
    answer, metrics = _chat_and_metrics([*args, "--speculative", "eagle", "--draft-model", str(head)])
    assert answer == plain
    assert metrics["localchat_spec_draft_tokens_total"] > 0


def test_a_head_for_another_target_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = tiny_config()
    target = write_tiny_gguf(tmp_path / "target.gguf", random_state_dict(cfg), cfg, qtype="F32")
    head = random_eagle_head(tmp_path / "head", 256, TINY_VOCAB_SIZE, [0, 1, 2], target_hidden=512)
    eagle = ["--speculative", "eagle", "--draft-model", str(head)]
    run = subprocess.run(
        [sys.executable, "-m", "localchat", "serve", *server_args("torch", target), "--p", "0", *eagle],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "LOCALCHAT_HOME": str(tmp_path)},
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert "was not trained for target: it reads hidden states of size 512, target has 256" in run.stderr
