"""`localchat serve --tp 2` on CPU (gloo, a spawned worker) answers a chat exactly like `--tp 1`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.live_server import live_server, server_args
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow


def _chat(args: list[str]) -> str:
    with live_server(args) as server, server.client() as client:
        reply = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Say something about tensors."}],
                "max_tokens": 12,
                "temperature": 0,
            },
        )
        assert reply.status_code == 200, reply.text
        content = reply.json()["choices"][0]["message"]["content"]
    assert server.proc.returncode == 0, server.log()[-2000:]  # the worker did not block the shutdown
    return str(content)


def test_tp2_server_answers_like_tp1(tmp_path: Path) -> None:
    cfg = tiny_config()
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=3), cfg, qtype="F32")
    args = [*server_args("torch", model), "--device", "cpu", "--threads", "1"]
    single = _chat([*args, "--tp", "1"])
    assert single
    assert _chat([*args, "--tp", "2"]) == single
