"""The web UI shows why an answer stopped when the loop guard ended it, and uses --chat-max-tokens."""

from __future__ import annotations

import time
from pathlib import Path

from litestar.testing import TestClient

from tests.ui.web_app import fake_app, web_state

HX = {"HX-Request": "true"}


def test_a_looping_answer_ends_with_a_visible_note(tmp_path: Path) -> None:
    app, ctx = fake_app(tmp_path, loop_stop=64, chat_max_tokens=500)
    with TestClient(app) as client:
        r = client.post("/ui/chats", data={"content": "<<say:" + "ab" * 300 + ">>"}, headers=HX)
        conv_id = r.headers["hx-redirect"].rsplit("/", 1)[1]
        state = web_state(client.app)
        deadline = time.monotonic() + 10
        while state.chats.is_generating(conv_id):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        answer = state.store.get_messages(conv_id)[-1]
        assert (answer.finish_reason, answer.completion_tokens) == ("repetition", 64)
        page = client.get(f"/c/{conv_id}").text
        assert "kept repeating itself" in page and "max tokens limit" not in page
        # A conversation without its own max tokens gets --chat-max-tokens, not the API's 4096.
        assert state.chats.model_defaults(ctx)["max_tokens"] == 500
