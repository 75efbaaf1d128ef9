"""Granite 4.0-H (Mamba-2 + attention + MoE) through the real server: a tiny random checkpoint folder served
by `localchat serve` on the torch backend in float32, more concurrent greedy requests than state slots
(with small prefill chunks), each answered with transformers' greedy tokens for that prompt alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.test_granitemoehybrid import tiny_granite
from tests.helpers.hybrid_server import PROMPTS, assert_greedy_at_once, expected_answers, write_hybrid_folder
from tests.helpers.live_server import live_server
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE


@pytest.mark.slow
def test_granite_hybrid_serves_concurrent_requests_with_state_slots(tmp_path: Path) -> None:
    folder = tmp_path / "granite-4.0-h-tiny-random"
    hf = tiny_granite(vocab_size=TINY_VOCAB_SIZE)
    tok = write_hybrid_folder(folder, hf)
    expected = expected_answers(tok, hf, PROMPTS)
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32"]
    args += ["--max-num-seqs", "2", "--prefill-chunk-size", "8", "--mem", "16"]
    with live_server(args) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]

        assert_greedy_at_once(client, model, expected)
        metrics = server.metrics()
        assert metrics["localchat_state_slots_total"] == 2
        assert metrics["localchat_state_bytes_per_slot"] == 2 * (3 * 192 * 4 + 4 * 32 * 16 * 4)
