"""A real `localchat serve` subprocess on a free port, and checks of raw SSE bytes against the
streaming invariants of the API contract. Used by tests/e2e and some CLI tests."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def real_backend_missing() -> str | None:
    """Why the real-model server cannot run here yet (None when it can)."""
    for module in ("localchat.weights.loader", "localchat.backends.torch.runner"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not there yet"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    api_key: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(
            base_url=self.base_url, headers=headers, timeout=kwargs.pop("timeout", 120), **kwargs
        )

    def metrics(self) -> dict[str, float]:
        with self.client() as c:
            text = c.get("/metrics").text
        return {
            k: float(v) for k, v in (line.split() for line in text.splitlines() if line and line[0] != "#")
        }

    def healthy(self) -> bool:
        return self.health_status() == 200

    def health_status(self) -> int | None:
        """/health's status code (503 while the model gets ready), None while nothing listens."""
        try:
            return httpx.get(self.base_url + "/health", timeout=5).status_code
        except httpx.HTTPError:
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def server_args(backend: str, model: Path | None) -> list[str]:
    if backend == "fake":
        return ["--backend", "fake"]
    assert model is not None
    if backend == "real-mlx":
        return [
            "--f",
            str(model),
            "--backend",
            "mlx",
        ]  # float32 on CPU (see localchat/backends/mlx/runner.py)
    # fp32: tests compare greedy outputs across batch shapes; bf16 rounding differs with the batch and
    # flips near-tied tokens (the runners promise batch invariance in fp32, tests/backends). live_server
    # also sets LOCALCHAT_TORCH_QUANT=dequant for it: with fp32 compute `auto` runs GGUF blocks on the
    # kernels, whose few-row and many-row paths round differently.
    return ["--f", str(model), "--backend", "torch", "--dtype", "float32"]


@contextlib.contextmanager
def live_server(
    args: list[str],
    *,
    api_key: str | None = None,
    env: dict[str, str] | None = None,
    startup_s: float = 180,
    ui: bool = False,
    wait_for_model: bool = True,
) -> Iterator[LiveServer]:
    """`wait_for_model=False` yields as soon as the server listens (the model may still be loading)."""
    port = free_port()
    log_file = tempfile.NamedTemporaryFile(prefix="localchat-serve-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [sys.executable, "-m", "localchat", "serve", "--p", str(port), "--log", "warning", *args]
    if not ui:
        cmd.append("--no-ui")
    if api_key:
        cmd += ["--api-key", api_key]
    full_env = {**os.environ, "LOCALCHAT_HOME": tempfile.mkdtemp(prefix="localchat-home-"), **(env or {})}
    if any(
        args[i : i + 2] == ["--dtype", "float32"] for i in range(len(args))
    ):  # the exact path (server_args)
        full_env.setdefault("LOCALCHAT_TORCH_QUANT", "dequant")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
    server = LiveServer(proc, port, Path(log_file.name), api_key)
    try:
        deadline = time.monotonic() + startup_s
        while not (server.healthy() if wait_for_model else server.health_status() is not None):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"localchat serve did not start (exit {proc.poll()}):\n{server.log()[-3000:]}")
            time.sleep(0.1)
        yield server
    finally:
        server.stop()
        log_file.close()


# -- SSE -----------------------------------------------------------------------------------------------


def parse_sse(raw: bytes) -> list[dict[str, Any] | str]:
    """Events of a stream: each JSON payload as a dict, `[DONE]` as the string. Fails on anything that
    is neither a `data: ` event nor a `:` comment (what would end Dify's stream)."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-80:]!r}"
    events: list[dict[str, Any] | str] = []
    for block in text.split("\n\n")[:-1]:
        lines = [ln for ln in block.split("\n") if not ln.startswith(":")]
        if not lines:
            continue  # keep-alive comment
        assert len(lines) == 1 and lines[0].startswith("data: "), f"not one data line: {block!r}"
        payload = lines[0][len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def check_chat_stream(
    events: list[dict[str, Any] | str], *, n: int = 1, include_usage: bool = False
) -> dict[str, Any]:
    """Assert the contract's streaming invariants; return per-choice text, finish reasons and usage."""
    assert events and events[-1] == "[DONE]", "last event must be [DONE]"
    assert "[DONE]" not in events[:-1]
    chunks = events[:-1]
    assert all(isinstance(c, dict) for c in chunks)
    assert not any("error" in c for c in chunks), chunks
    first = chunks[0]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"].get("role") == "assistant"
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    texts = [""] * n
    reasons: dict[int, str] = {}
    usage_chunks = [c for c in chunks if c.get("usage")]
    for c in chunks:
        for choice in c["choices"]:
            i = choice["index"]
            assert i not in reasons, f"choice {i} has a chunk after its finish_reason"
            texts[i] += choice["delta"].get("content") or ""
            if choice["finish_reason"] is not None:
                reasons[i] = choice["finish_reason"]
    assert sorted(reasons) == list(range(n)), f"exactly one finish_reason per choice: {reasons}"
    if include_usage:
        assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1]["choices"] == []
    else:
        assert not usage_chunks and all("usage" not in c or c["usage"] is None for c in chunks)
    return {"texts": texts, "reasons": reasons, "usage": usage_chunks[0]["usage"] if usage_chunks else None}
