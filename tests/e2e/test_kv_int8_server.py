"""`--kv-cache-dtype` as a user meets it: a real server with an int8 KV cache answering the official
openai client, the startup log line with the pool's dtype and size, and bad values refused readably."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.helpers.live_server import REPO, free_port, live_server

# SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64. Bytes per 16-token block: int8 2*30*16*3*(64 + 4),
# bf16 2*30*16*3*128. 64 MiB: 342 int8 blocks, 182 bf16 ones (1.88x).
INT8_BLOCKS_64MIB = 64 * 2**20 // (2 * 30 * 16 * 3 * (64 + 4))


def _localchat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localchat", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.slow
def test_server_with_int8_kv_cache_answers_the_openai_client(smollm2_gguf: Path) -> None:
    args = ["--f", str(smollm2_gguf), "--backend", "torch", "--kv-cache-dtype", "int8", "--mem", "64"]
    with live_server([*args, "--log", "info"]) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
        assert "Paris" in (reply.choices[0].message.content or "")
        line = re.search(r"KV cache: (\d+) blocks of 16 tokens, (\w+)", server.log())
        assert line is not None, server.log()[-2000:]
        assert (int(line.group(1)), line.group(2)) == (INT8_BLOCKS_64MIB, "int8")
        assert "KV cache int8" in server.log()  # the runner's device line


@pytest.mark.parametrize("how", ["flag", "env"])
def test_bad_kv_cache_dtype_is_a_readable_error(how: str) -> None:
    if how == "flag":
        run = _localchat("serve", "--backend", "fake", "--kv-cache-dtype", "fp8")
    else:
        run = _localchat("serve", "--backend", "fake", env={"LOCALCHAT_KV_CACHE_DTYPE": "fp8"})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "--kv-cache-dtype" in run.stderr and "'fp8'" in run.stderr and "int8" in run.stderr


@pytest.mark.slow
@pytest.mark.mlx
def test_mlx_refuses_int8_naming_the_flag(smollm2_gguf: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    run = _localchat(
        "serve", "--p", str(free_port()), "--f", str(smollm2_gguf), "--backend", "mlx", "--kv-cache-dtype",
        "int8", env={"LOCALCHAT_HOME": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "--kv-cache-dtype int8 is not available on the MLX backend" in run.stderr
