"""Two "nodes" on 127.0.0.1: `torchrun --nnodes 2 --node-rank {0,1} --nproc-per-node 1 -m localchat
serve --tp 2` (and `--pp 2`). Rank 0 serves HTTP and the engine, rank 1 only runs the steps it is
sent; the greedy chat answer equals `--tp 1`'s, and stopping rank 0 ends rank 1 cleanly."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.live_server import REPO, free_port, live_server, server_args
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow

CHAT = {
    "messages": [{"role": "user", "content": "Say something about tensors."}],
    "max_tokens": 12,
    "temperature": 0,
}


def _torchrun(node_rank: int, master_port: int, serve_args: list[str], log: Path) -> subprocess.Popen[bytes]:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    cmd = [
        torchrun,
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master_port),
        "-m",
        "localchat",
        "serve",
        *serve_args,
    ]
    env = {
        **os.environ,
        "LOCALCHAT_HOME": tempfile.mkdtemp(prefix="localchat-home-"),
        "LOCALCHAT_TORCH_QUANT": "dequant",
        "LOCALCHAT_LOG": "info",  # not --log: torchrun's own parser reads it as an abbreviation of its --log-dir
    }
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


@pytest.mark.parametrize("flag", ["--tp", "--pp"])  # --pp: node 0 holds layer 0, node 1 layer 1
def test_two_torchrun_nodes_answer_like_one_rank(tmp_path: Path, flag: str) -> None:
    cfg = tiny_config()
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=3), cfg, qtype="F32")
    args = [*server_args("torch", model), "--device", "cpu", "--threads", "1"]
    with live_server([*args, "--tp", "1"]) as single, single.client() as client:
        expected = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]

    port = free_port()
    serve_args = [*args, flag, "2", "--p", str(port), "--no-ui"]
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    master_port = free_port()
    nodes = [_torchrun(rank, master_port, serve_args, logs[rank]) for rank in (0, 1)]
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or any(n.poll() is not None for n in nodes):
                pytest.fail(
                    "torchrun nodes did not serve:\n" + "\n".join(p.read_text()[-2000:] for p in logs)
                )
            time.sleep(0.2)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == expected
        worker_log = logs[1].read_text()
        assert "worker rank 1 of 2 joined" in worker_log and "Uvicorn" not in worker_log  # no HTTP on rank 1
        nodes[0].send_signal(signal.SIGTERM)
        assert nodes[1].wait(60) == 0, logs[1].read_text()[-2000:]  # rank 0's shutdown ended its loop
        nodes[0].wait(60)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait(10)


def test_torchrun_world_must_equal_tp(tmp_path: Path) -> None:
    """torchrun started 1 process but --tp says 2: a clear message before anything loads."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(free_port())
    env["LOCALCHAT_HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "localchat", "serve", "--backend", "torch", "--tp", "2", "--no-ui"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    assert "WORLD_SIZE" in done.stderr and "--pipeline-parallel-size is 2" in done.stderr
