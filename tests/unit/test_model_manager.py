"""The model manager on the fake backend: the server listens before its model is ready (/health states,
503 with Retry-After), load failures, the memory check, and /health's contract for the desktop."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from localchat.errors import InsufficientMemoryError
from localchat.models.manager import ModelManager
from localchat.models.memory import GIB, MIB, check_fits, compact_gguf_types, estimate
from localchat.server.app import create_app
from localchat.serving.assembly import build_context
from tests.helpers.fake_app import fake_settings, say


def gated_build(gate: threading.Event, error: Exception | None = None) -> Any:
    """The real build (fake backend), held until `gate` opens: a model that takes a while to load."""

    def build(settings: Any, **kwargs: Any) -> Any:
        assert gate.wait(20), "the test never opened the gate"
        if error is not None:
            raise error
        return build_context(settings, **kwargs)

    return build


def wait_health(client: TestClient[Any], status: str, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get("/health").json()
        if body["status"] == status or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def test_listens_before_the_model_is_loaded_then_serves(tmp_path: Path) -> None:
    settings = fake_settings(home=str(tmp_path))
    gate = threading.Event()
    with TestClient(create_app(settings, ModelManager(settings, build=gated_build(gate))), timeout=30) as c:
        health = c.get("/health")
        assert health.status_code == 503
        body = health.json()
        assert body["status"] == "loading" and body["model"] == "fake-model"
        assert body["progress"]["phase"] == "loading" and "fake-model" in body["progress"]["message"]

        chat = c.post("/v1/chat/completions", json={"model": "", "messages": say("hi")})
        assert chat.status_code == 503 and int(chat.headers["retry-after"]) >= 1
        error = chat.json()["error"]
        assert error["code"] == "model_loading" and "'fake-model' is loading" in error["message"]
        assert c.get("/metrics").text.strip().endswith("localchat_models_loaded 0")
        # A client that lists models once at connect must see the start-up model while it loads.
        loading_cards = c.get("/v1/models").json()["data"]
        assert [(m["id"], m["loaded"], m["status"]) for m in loading_cards] == [
            ("fake-model", False, "loading")
        ]
        assert c.get("/v1/models/fake-model").json()["status"] == "loading"

        gate.set()
        assert wait_health(c, "ok") == {"status": "ok", "model": "fake-model", "loaded": ["fake-model"]}
        answer = c.post("/v1/chat/completions", json={"model": "fake-model", "messages": say("ready")})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "ready"
        cards = c.get("/v1/models").json()["data"]
        assert cards[0]["id"] == "fake-model" and cards[0]["loaded"] is True and cards[0]["max_model_len"] > 0


def test_a_failed_load_is_reported_not_fatal(tmp_path: Path) -> None:
    from localchat.errors import ModelLoadError

    settings = fake_settings(home=str(tmp_path))
    gate = threading.Event()
    gate.set()
    broken = gated_build(gate, ModelLoadError("model.gguf is truncated (read 10 of 20 bytes)."))
    with TestClient(create_app(settings, ModelManager(settings, build=broken)), timeout=30) as c:
        body = wait_health(c, "error")
        assert body == {"status": "error", "detail": "model.gguf is truncated (read 10 of 20 bytes)."}
        chat = c.post("/v1/chat/completions", json={"messages": say("hi")})
        assert chat.status_code == 500 and "truncated" in chat.json()["error"]["message"]


def test_health_says_shutting_down_while_draining(tmp_path: Path) -> None:
    settings = fake_settings(home=str(tmp_path))
    manager = ModelManager(settings)
    with TestClient(create_app(settings, manager), timeout=30) as c:
        wait_health(c, "ok")
        manager.draining = True
        assert c.get("/health").json() == {"status": "shutting_down"}
        refused = c.post("/v1/chat/completions", json={"messages": say("late")})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        manager.draining = False


def test_memory_estimate_and_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unreadable headers (zeros): the estimate goes by the filename's type (test_model_memory_gguf.py
    covers real files tensor by tensor)."""
    packed = tmp_path / "m.Q4_1.gguf"
    packed.write_bytes(b"\0" * 1000)
    kquant = tmp_path / "m.Q4_K_M.gguf"
    kquant.write_bytes(b"\0" * 1000)
    monkeypatch.setenv("LOCALCHAT_KERNELS", "off")  # the pure-torch path: only Q4_0/Q4_1 stay packed
    assert estimate(packed, None).weights == 1000  # 4-bit codes kept as they are
    assert estimate(kquant, None).weights == pytest.approx(1000 * 16 / 4.8, abs=1)  # expanded to bf16
    monkeypatch.delenv("LOCALCHAT_KERNELS")
    if "Q4_K" in compact_gguf_types():  # the compiled kernels read K-quant blocks in place
        assert estimate(kquant, None).weights == 1000
    need = estimate(packed, kv_cache_mib=1024)
    assert need.kv_cache == 1024 * MIB and need.total > 1024 * MIB
    check_fits("m", need, available=4 * GIB)
    check_fits("m", need, available=512 * MIB, freeable=2 * GIB)  # unloading another model makes room
    with pytest.raises(InsufficientMemoryError) as info:
        check_fits("m", need, available=512 * MIB)
    assert info.value.status == 507 and "'m' needs about 1.4 GiB" in info.value.message
    assert "--kv-cache-mib" in info.value.message and "0.5 GiB is free" in info.value.message
