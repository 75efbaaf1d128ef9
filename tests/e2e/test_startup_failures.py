"""Startup failures a new user meets, run as the user runs them (`python -m localchat` subprocesses):
each is one readable line naming what to change, exit code 1 or 2, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from localchat.engine.interface import KVCacheSpec
from localchat.serving.assembly import check_kv_budget
from localchat.settings_rules import MIN_CONTEXT_TOKENS
from tests.helpers.fake_app import fake_settings
from tests.helpers.live_server import REPO, free_port, live_server


def _localchat(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localchat", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _clean_failure(run: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert run.returncode == code, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    return run.stderr


def test_port_in_use_is_reported_before_the_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # A model file that does not exist: had the model been loaded first, that would be the error.
        run = _localchat(
            "serve",
            "--p",
            str(port),
            "--f",
            str(tmp_path / "missing.gguf"),
            env={"LOCALCHAT_HOME": str(tmp_path)},
        )
    err = _clean_failure(run)
    assert f"port {port} is in use; pass --p PORT" in err
    assert "missing.gguf" not in err


def test_unwritable_data_dir_names_the_directory_and_the_fix(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    home = blocker / "localchat"  # root ignores permission bits; a path under a file fails for everyone
    for how in ({"LOCALCHAT_HOME": str(home)}, {"LOCALCHAT_HOME": str(tmp_path), "ARGS": "--home"}):
        args = ["serve", "--p", str(free_port()), "--backend", "torch"]
        if how.pop("ARGS", None):
            args += ["--home", str(home)]
        err = _clean_failure(_localchat(*args, env=how))
        assert str(home) in err and "--home" in err and "LOCALCHAT_HOME" in err


def test_web_ui_shows_a_readable_page_when_the_conversations_cannot_open(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    home = blocker / "localchat"
    with live_server(["--backend", "fake"], ui=True, env={"LOCALCHAT_HOME": str(home)}) as server:
        page = httpx.get(server.base_url + "/", timeout=30)
        assert page.status_code == 500
        assert page.headers["content-type"].startswith("text/html")
        assert "conversations cannot be opened" in page.text and "--home" in page.text
        assert str(home) in page.text
        partial = httpx.get(server.base_url + "/ui/conversations", headers={"HX-Request": "true"}, timeout=30)
        assert partial.headers["content-type"].startswith("text/html") and "--home" in partial.text
        # the API does not need the data dir, and keeps working
        assert httpx.get(server.api_url + "/models", timeout=30).status_code == 200


def test_max_model_len_below_a_useful_minimum_is_refused():
    err = _clean_failure(_localchat("serve", "--backend", "fake", "--max-model-len", "10"), code=2)
    assert "--max-model-len" in err and f"--max-model-len {MIN_CONTEXT_TOKENS}" in err


def test_mem_too_small_for_the_model_names_the_smallest_value():
    spec = KVCacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=4)  # SmolLM2-135M, fp32
    with pytest.raises(
        Exception, match=r"--kv-cache-mib 1 MiB .* smallest that works is --kv-cache-mib 12\b"
    ) as info:
        check_kv_budget(fake_settings(kv_cache_mib=1), spec, model_max_len=8192)
    assert info.value.param == "kv_cache_mib"  # type: ignore[attr-defined]
    check_kv_budget(fake_settings(kv_cache_mib=12), spec, model_max_len=8192)  # 12 MiB holds 17 blocks of 16
    check_kv_budget(fake_settings(kv_cache_mib=None), spec, model_max_len=8192)  # sized from free memory


@pytest.mark.slow
def test_mem_too_small_for_the_real_model_is_refused_at_startup(smollm2_gguf: Path, tmp_path):
    run = _localchat(
        "serve", "--p", str(free_port()), "--f", str(smollm2_gguf), "--backend", "torch", "--dtype", "float32",
        "--mem", "1", env={"LOCALCHAT_HOME": str(tmp_path)}, timeout=300,
    )  # fmt: skip
    err = _clean_failure(run)
    assert "--kv-cache-mib 1 MiB" in err and "smallest that works is --kv-cache-mib 12" in err


def test_wrong_backend_variables_are_refused_at_startup_in_one_line(tmp_path):
    """Checked before the model is read (the file is no GGUF: reading it would fail otherwise), every
    wrong one named at once."""
    model = tmp_path / "broken.gguf"
    model.write_bytes(b"not a GGUF file")
    env = {"LOCALCHAT_HOME": str(tmp_path), "LOCALCHAT_TORCH_QUANT": "int3", "LOCALCHAT_DECODE_STEP": "fast"}
    run = _localchat("serve", "--p", str(free_port()), "--f", str(model), env=env)
    err = _clean_failure(run)
    assert (
        "LOCALCHAT_TORCH_QUANT='int3' is not a quantization mode; use one of auto, int4, dequant, copies. "
        "LOCALCHAT_DECODE_STEP='fast' is not a choice; use one of fused, layers." in err
    )
    assert "broken.gguf" not in err
    assert err.count("LOCALCHAT_TORCH_QUANT") == 1


def test_no_browser_says_where_to_open_the_ui(tmp_path):
    port = free_port()
    env = {**os.environ, "LOCALCHAT_HOME": str(tmp_path), "BROWSER": "false"}  # a browser that fails
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "localchat", "--ui-server", "--backend", "fake", "--p", str(port)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        lines = []
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "in your browser" in line or not line:
                break
        assert f"open http://127.0.0.1:{port}/ in your browser" in "".join(lines), "".join(lines)
    finally:
        proc.terminate()
        proc.wait(30)
