"""Models at run time, over real HTTP (uvicorn in a thread, fake backend) with the fake Hugging Face hub:
pull through the management API while chatting on another model, watch and cancel a pull (the partial
stays, the next pull resumes), switch models through the `model` field (openai SDK), LRU eviction,
unloading that lets in-flight requests finish, the memory check, delete."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from localchat.models.manager import ModelManager
from localchat.models.memory import MIB
from tests.helpers.fake_app import say
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf
from tests.ui.web_app import LiveApp, live_app

TINY, OTHER, BIG = "org/tiny-GGUF", "org/other-GGUF", "org/big-GGUF"
BIG_SIZE = 6 << 20  # the hub's download reads 1 MiB chunks: a cancel lands between two of them


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    cfg = tiny_config()
    path = tmp_path_factory.mktemp("tiny") / "tiny-Q4_0.gguf"
    return write_tiny_gguf(path, random_state_dict(cfg), cfg, qtype="Q4_0").read_bytes()


@pytest.fixture
def hub(fake_hub: Any, tiny_bytes: bytes) -> Any:
    fake_hub.add_repo(TINY, {"tiny-Q4_0.gguf": tiny_bytes})
    fake_hub.add_repo(OTHER, {"other-Q4_0.gguf": tiny_bytes + b"\0" * 32})  # another file, same model
    fake_hub.add_repo(BIG, {"big-Q4_0.gguf": tiny_bytes + b"\0" * (BIG_SIZE - len(tiny_bytes))})
    return fake_hub


@pytest.fixture
def live(hub: Any, tmp_path: Path) -> Iterator[LiveApp]:
    with live_app(tmp_path / "home") as app:
        yield app


def api(live: LiveApp) -> httpx.Client:
    return httpx.Client(base_url=live.url, timeout=60)


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[len("data: ") :])


def pull(client: httpx.Client, name: str) -> list[dict[str, Any]]:
    with client.stream("POST", "/api/models/pull", json={"name": name}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        return list(sse(response))


def local_names(client: httpx.Client, *, complete: bool = True) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in client.get("/api/models").json()["local"] if m["complete"] == complete}


def test_pull_through_the_api_while_chatting_on_another_model(live: LiveApp) -> None:
    with api(live) as client:
        answer: dict[str, Any] = {}
        slow = threading.Thread(
            target=lambda: answer.update(
                client.post("/v1/chat/completions", json={"messages": say("still here", slow_ms=40)}).json()
            )
        )
        slow.start()
        events = pull(client, f"{TINY}:Q4_0")
        slow.join(30)
        phases = [e["phase"] for e in events]
        assert phases[-1] == "done" and "downloading" in phases, phases
        done = [e["done_bytes"] for e in events if e["phase"] == "downloading"]
        assert done == sorted(done)
        assert answer["choices"][0]["message"]["content"] == "still here"
        assert answer["model"] == "fake-model"

        local = local_names(client)
        (name,) = [n for n in local if n.startswith(TINY)]
        assert local[name]["loaded"] is False and local[name]["size_bytes"] > 0
        cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        assert cards["fake-model"]["loaded"] is True and cards[name]["loaded"] is False
        assert "max_model_len" not in cards[name]


def test_switch_models_through_the_model_field(live: LiveApp) -> None:
    with api(live) as client:
        pull(client, f"{TINY}:Q4_0")
        name = next(n for n in local_names(client) if n.startswith(TINY))
    sdk = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
    reply = sdk.chat.completions.create(model=name, messages=say("from the tiny one"))  # type: ignore[arg-type]
    assert reply.model == name and reply.choices[0].message.content == "from the tiny one"
    health = httpx.get(live.url + "/health").json()
    assert health == {"status": "ok", "model": name, "loaded": [name]}  # --max-loaded-models 1: swapped
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(model="no-such-model", messages=say("x"))  # type: ignore[arg-type]
    assert name in str(info.value) and "localchat pull" in str(info.value)
    loaded = [m for m in sdk.models.list().data if getattr(m, "loaded", False)]
    assert [m.id for m in loaded] == [name]


def test_lru_eviction_keeps_max_loaded_models(hub: Any, tmp_path: Path) -> None:
    with live_app(tmp_path / "home", max_loaded_models=2) as live, api(live) as client:
        pull(client, f"{TINY}:Q4_0")
        pull(client, f"{OTHER}:Q4_0")
        tiny, other = (next(n for n in local_names(client) if n.startswith(r)) for r in (TINY, OTHER))
        for model in (tiny, "fake-model"):  # loads tiny (2 loaded), then uses fake-model: tiny is LRU
            r = client.post("/v1/chat/completions", json={"model": model, "messages": say("hi")})
            assert r.status_code == 200 and r.json()["model"] == model
        assert client.post("/api/models/load", json={"name": other}).json()["loaded"] == [other, "fake-model"]


def test_unloading_lets_in_flight_requests_finish(live: LiveApp) -> None:
    with api(live) as client:
        text = "every word of this answer arrives"
        done: dict[str, Any] = {}
        stream = threading.Thread(
            target=lambda: done.update(
                client.post("/v1/chat/completions", json={"messages": say(text, slow_ms=30)}).json()
            )
        )
        stream.start()
        while live.ctx.engine.num_in_flight == 0:
            threading.Event().wait(0.01)
        unloaded = client.post("/api/models/unload", json={"name": "fake-model"}).json()
        stream.join(30)
        assert unloaded == {"name": "fake-model", "unloaded": True, "loaded": []}
        assert done["choices"][0]["message"]["content"] == text
        assert done["choices"][0]["finish_reason"] == "stop"
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "no_model"
        refused = client.post("/v1/chat/completions", json={"messages": say("hi")})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_model"


def test_cancel_keeps_the_partial_a_watcher_sees_it_and_the_next_pull_resumes(
    live: LiveApp, hub: Any
) -> None:
    from tests.helpers.fake_hub import Fault

    hub.faults["big-Q4_0.gguf"] = Fault(throttle_bps=2 << 20)
    name = f"{BIG}:Q4_0"
    with api(live) as client, api(live) as watcher:
        first: list[dict[str, Any]] = []
        puller = threading.Thread(target=lambda: first.extend(pull(client, name)))
        puller.start()
        while not any(p["name"] == name for p in watcher.get("/api/models").json()["pulls"]):
            threading.Event().wait(0.02)  # the second client joins once the first one started it
        with watcher.stream("GET", "/api/models/pull", params={"name": name}) as response:
            seen = []
            for event in sse(response):
                seen.append(event)
                if event["phase"] == "downloading" and event["done_bytes"] >= 1 << 20:
                    assert watcher.post("/api/models/pull/cancel", json={"name": name}).json()["cancelled"]
        puller.join(30)
        assert seen[-1]["phase"] == "cancelled" and first[-1]["phase"] == "cancelled"
        partial = local_names(client, complete=False)
        assert partial and next(iter(partial.values()))["partial_bytes"] > 0
        hub.faults.clear()
        assert pull(client, name)[-1]["phase"] == "done"
        starts = [r.range_start for r in hub.requests("cdn") if r.method == "GET"]
        assert starts[-1] and starts[-1] > 0, starts  # the second pull asked only for the rest


def test_memory_check_refuses_before_loading(hub: Any, tmp_path: Path) -> None:
    from litestar.testing import TestClient

    from localchat import hub as local_hub
    from localchat.server.app import create_app
    from tests.helpers.fake_app import fake_settings

    model = local_hub.pull(f"{TINY}:Q4_0")
    settings = fake_settings()  # the runtime alone needs more than the 64 MiB we pretend to have free
    manager = ModelManager(settings, available_memory=lambda: 64 * MIB)
    with TestClient(create_app(settings, manager), timeout=30) as client:
        refused = client.post("/api/models/load", json={"name": model.name})
        assert refused.status_code == 507
        error = refused.json()["error"]
        assert error["code"] == "insufficient_memory" and "GiB of RAM" in error["message"]
        assert client.get("/health").json()["loaded"] == ["fake-model"]  # nothing was unloaded for it


def test_delete_a_local_model(live: LiveApp) -> None:
    with api(live) as client:
        pull(client, f"{TINY}:Q4_0")
        name = next(n for n in local_names(client) if n.startswith(TINY))
        client.post("/api/models/load", json={"name": name})
        deleted = client.delete(f"/api/models/{name}").json()
        assert deleted["deleted"] is True and deleted["freed_bytes"] > 0
        assert name not in local_names(client)
        assert name not in client.get("/health").json().get("loaded", [])


@pytest.mark.slow
def test_health_shows_the_start_up_download_then_the_load(
    hub: Any, tiny_bytes: bytes, tmp_path: Path
) -> None:
    """`serve --m ORG/REPO:QUANT` with nothing on disk: /health says downloading (with the pull's
    progress), and ok once the real weights (torch) are loaded; the API answers 503 meanwhile."""
    from litestar.testing import TestClient

    from localchat.server.app import create_app
    from tests.helpers.fake_app import fake_settings
    from tests.helpers.fake_hub import Fault
    from tests.helpers.live_server import real_backend_missing

    if why := real_backend_missing():
        pytest.skip(why)
    hub.faults["tiny-Q4_0.gguf"] = Fault(throttle_bps=len(tiny_bytes) // 2)  # ~2 s of download
    settings = fake_settings(backend="torch", dtype="float32", model=f"{TINY}:Q4_0", kv_cache_mib=16)
    with TestClient(create_app(settings, ModelManager(settings)), timeout=60) as client:
        seen: list[dict[str, Any]] = []
        refused = None
        while (health := client.get("/health")).status_code != 200:
            seen.append(health.json())
            assert seen[-1]["status"] in ("downloading", "loading"), seen[-1]
            if refused is None and seen[-1]["status"] == "downloading":
                refused = client.post("/v1/chat/completions", json={"messages": say("hi")})
            threading.Event().wait(0.05)
        downloading = [s for s in seen if s["status"] == "downloading"]
        assert downloading and downloading[0]["model"] == f"{TINY}:Q4_0"
        assert {s["progress"]["phase"] for s in downloading} <= {
            "resolving",
            "downloading",
            "verifying",
            "done",
        }
        assert refused is not None and refused.status_code == 503 and "downloading" in refused.text
        assert health.json() == {"status": "ok", "model": f"{TINY}:Q4_0", "loaded": [f"{TINY}:Q4_0"]}


def test_management_api_errors_are_typed(live: LiveApp) -> None:
    with api(live) as client:
        events = pull(client, "org/no-such-repo-GGUF:Q4_0")
        assert events[-1]["phase"] == "error" and "org/no-such-repo-GGUF" in events[-1]["message"]
        missing = client.post("/api/models/load", json={"name": "org/no-such-repo-GGUF:Q4_0"})
        assert missing.status_code == 404 and "localchat pull" in missing.json()["error"]["message"]
        empty = client.post("/api/models/pull", json={"name": " "})
        assert empty.status_code == 400 and empty.json()["error"]["param"] == "name"
        watch = client.get("/api/models/pull", params={"name": "never-started"})
        assert watch.status_code == 404
        form = client.post("/api/models/load", data={"name": "x"})  # not JSON: the API refuses it
        assert form.status_code == 415
