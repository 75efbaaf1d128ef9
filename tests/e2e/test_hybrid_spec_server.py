"""Speculative decoding on a hybrid model through the real server (engine/hybrid_spec.py): the tiny random
Qwen3.5 folder of test_hybrid_server.py served with `--speculative ngram` on the torch backend in float32.
Start-up sizes the spec rows and says so; concurrent greedy completions (a prompt that repeats itself
among them) each return transformers' greedy tokens; /metrics names the method and counts the drafts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_hybrid_server import _write_folder
from tests.helpers.hybrid_server import assert_greedy_at_once, expected_answers
from tests.helpers.live_server import live_server

PROMPTS = ["one two three one two three one two three one two", "The quick brown fox", "def add(a, b):"]


@pytest.mark.slow
def test_hybrid_model_speculates_with_plain_greedy_answers(tmp_path: Path) -> None:
    tok, hf = _write_folder(tmp_path / "qwen3_5-tiny")
    expected = expected_answers(tok, hf, PROMPTS)
    args = ["--w", str(tmp_path / "qwen3_5-tiny"), "--backend", "torch", "--dtype", "float32"]
    args += ["--max-num-seqs", "4", "--mem", "16", "--log", "info", "--speculative", "ngram"]
    with live_server(args) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]

        assert_greedy_at_once(client, model, expected)  # 6 tokens each
        log = server.log()
        assert "Speculative decoding off" not in log, log[-2000:]
        assert re.search(r"Speculation on a hybrid model: 16 spec rows", log), log[-2000:]
        metrics = server.metrics()
        assert metrics['localchat_speculative_method{method="ngram",chosen_by="flag"}'] == 1
        assert metrics["localchat_state_slots_used"] == 0
