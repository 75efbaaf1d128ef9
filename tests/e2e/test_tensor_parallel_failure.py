"""A tensor-parallel worker killed under a live `serve --tp 2`: the request in flight ends with an
error naming the rank (no hang), /health turns to a 503 `error` saying so within seconds, and new
requests get an OpenAI-style 503 telling the user to restart."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.live_server import live_server, server_args
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow


def _worker_pid(server_pid: int) -> int:
    """The spawned rank-1 process among the server's children (not the resource tracker)."""
    children = subprocess.run(["pgrep", "-P", str(server_pid)], capture_output=True, text=True).stdout.split()
    for pid in children:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline:
            return int(pid)
    raise AssertionError(f"no spawned worker among {children}")


def test_killed_worker_fails_requests_and_health_clearly(tmp_path: Path) -> None:
    cfg = tiny_config(max_position_embeddings=4096)
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=3), cfg, qtype="F32")
    args = [*server_args("torch", model), "--device", "cpu", "--threads", "1", "--tp", "2"]
    with live_server(args) as server, server.client(timeout=30) as client:
        body = {
            "messages": [{"role": "user", "content": "Go on forever."}],
            "max_tokens": 4000,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = stream.iter_lines()
            for _ in range(5):  # the request is decoding on both ranks
                next(line for line in lines if line.startswith("data: "))
            os.kill(_worker_pid(server.proc.pid), signal.SIGKILL)
            killed = time.monotonic()
            rest = "\n".join(lines)  # ends (with an error event) instead of hanging
        assert time.monotonic() - killed < 10
        assert "worker rank 1 died" in rest, rest[-500:]

        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "error"
        assert "worker rank 1 died" in health.json()["detail"]
        assert "Restart localchat" in health.json()["detail"]

        reply = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert "worker rank 1 died" in error["message"] and error["code"] == "model_failed"
        assert "tensor-parallel worker rank 1 died" in server.log()  # logged by the server


def test_idle_server_reports_a_dead_worker_within_seconds(tmp_path: Path) -> None:
    cfg = tiny_config()
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=3), cfg, qtype="F32")
    args = [*server_args("torch", model), "--device", "cpu", "--threads", "1", "--tp", "2"]
    with live_server(args) as server:
        os.kill(_worker_pid(server.proc.pid), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while server.health_status() == 200:
            assert time.monotonic() < deadline, "/health still says ok 5 s after the worker died"
            time.sleep(0.1)
        detail = httpx.get(server.base_url + "/health", timeout=5).json()["detail"]
        assert "worker rank 1 died" in detail
