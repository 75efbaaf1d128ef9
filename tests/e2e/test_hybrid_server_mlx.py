"""The hybrid server check (tests/e2e/test_hybrid_server.py) on the MLX backend (CPU device, float32):
a tiny random Qwen3.5 folder served by `localchat serve --backend mlx`; concurrent greedy completions
whose prompts outnumber the state slots each return transformers' greedy tokens, and /metrics shows the
state pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_hybrid_server import _write_folder
from tests.helpers.hybrid_server import PROMPTS, assert_greedy_at_once, expected_answers
from tests.helpers.live_server import live_server

pytestmark = pytest.mark.mlx


@pytest.mark.slow
def test_hybrid_model_serves_concurrent_requests_on_mlx(tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    tok, hf = _write_folder(tmp_path / "qwen3_5-tiny")
    expected = expected_answers(tok, hf, PROMPTS)
    args = [
        "--w",
        str(tmp_path / "qwen3_5-tiny"),
        "--backend",
        "mlx",
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    args += ["--max-num-seqs", "2", "--prefill-chunk-size", "8", "--mem", "16", "--log", "info"]
    with live_server(args) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]

        assert_greedy_at_once(client, model, expected)
        metrics = server.metrics()
        assert metrics["localchat_state_slots_total"] == 2
        assert metrics["localchat_state_slots_used"] == 0
        assert metrics["localchat_prefix_caching_enabled"] == 1  # with state checkpoints
