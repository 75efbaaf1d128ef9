"""A model given with --f/--w (or a path as --m) is in no model store: after an unload or an eviction,
naming it must load it again from the flags (issue #27; it used to be 404 until a restart)."""

from __future__ import annotations

import time
from pathlib import Path

from litestar.testing import TestClient

from localchat.models.manager import ModelManager
from localchat.server.app import create_app
from tests.helpers.fake_app import fake_settings, say


def test_a_flag_model_stays_loadable_by_name_after_an_unload(tmp_path: Path) -> None:
    settings = fake_settings(home=str(tmp_path))
    manager = ModelManager(settings)
    with TestClient(create_app(settings, manager), timeout=30) as client:
        deadline = time.monotonic() + 20
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        unload = client.post("/api/models/unload", json={"name": "fake-model"})
        assert unload.status_code == 200 and manager.loaded == []
        # Named again, it is built from the flags again (it used to be 404 until a restart).
        r = client.post("/v1/chat/completions", json={"model": "fake-model", "messages": say("back")})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "back"
