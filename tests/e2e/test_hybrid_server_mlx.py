"""The hybrid server check (tests/e2e/test_hybrid_server.py) on the MLX backend (CPU device, float32):
a tiny random Qwen3.5 folder served by `localchat serve --backend mlx`; concurrent greedy completions
whose prompts outnumber the state slots each return transformers' greedy tokens, and /metrics shows the
state pool."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.test_hybrid_server import MAX_TOKENS, PROMPTS, _expected, _write_folder
from tests.helpers.live_server import live_server

pytestmark = pytest.mark.mlx


@pytest.mark.slow
def test_hybrid_model_serves_concurrent_requests_on_mlx(tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    tok, hf = _write_folder(tmp_path / "qwen3_5-tiny")
    expected = {p: tok.decode(_expected(tok, hf, p), skip_special_tokens=True) for p in PROMPTS}
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

        def ask(prompt: str) -> str:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            }
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["message"]["content"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = dict(zip(PROMPTS, pool.map(ask, PROMPTS), strict=True))
        for prompt in PROMPTS:
            assert answers[prompt] == expected[prompt], prompt
        metrics = server.metrics()
        assert metrics["localchat_state_slots_total"] == 2
        assert metrics["localchat_state_slots_used"] == 0
        assert metrics["localchat_prefix_caching_enabled"] == 1  # with state checkpoints
