"""The web UI's per-message stats show speculative decoding's numbers (drafted, accepted share, tokens
per target pass) for an answer written with it, and nothing new for one written without it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.ui.web_app import fake_app, web_state

HX = {"HX-Request": "true"}
SPEC_STAT = re.compile(r'class="stat-spec"[^>]*>(\d+) drafted, (\d+)% accepted, ([\d.]+) tokens/pass<')


def answer_in_new_chat(client: TestClient[Any], content: str) -> tuple[str, Any]:
    """Start a chat with `content`, wait for the answer, return (conversation id, stored answer)."""
    r = client.post("/ui/chats", data={"content": content}, headers=HX)
    conv_id = r.headers["hx-redirect"].rsplit("/", 1)[1]
    state = web_state(client.app)
    deadline = time.monotonic() + 120
    while state.chats.is_generating(conv_id):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return conv_id, state.store.get_messages(conv_id)[-1]


def test_stored_speculation_counts_render_in_the_stats_line(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    with TestClient(app) as client:
        conv_id, answer = answer_in_new_chat(client, "<<say:plain answer>>")
        assert answer.spec_draft_tokens == 0 and answer.target_passes == answer.completion_tokens > 0
        page = client.get(f"/c/{conv_id}").text
        assert "stat-speed" in page or "stat-tokens" in page
        assert "stat-spec" not in page and "drafted" not in page
        web_state(client.app).store.update_message(
            answer.id, completion_tokens=40, spec_draft_tokens=40, spec_accepted_tokens=30, target_passes=10
        )
        assert SPEC_STAT.findall(client.get(f"/c/{conv_id}").text) == [("40", "75", "4.00")]


@pytest.mark.slow
def test_a_speculated_answer_shows_its_acceptance_and_a_plain_one_does_not(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    pytest.importorskip("torch")
    prompt = "Repeat this line three times: the quick brown fox jumps over the lazy dog."
    real = {"backend": "torch", "file": str(smollm2_gguf), "kv_cache_mib": 64, "max_model_len": 2048}
    app, _ = fake_app(tmp_path / "spec", speculative="ngram", chat_max_tokens=64, **real)
    with TestClient(app) as client:
        conv_id, answer = answer_in_new_chat(client, prompt)
        assert answer.status == "done" and answer.spec_draft_tokens > 0
        assert answer.target_passes < answer.completion_tokens  # some drafts were kept
        [(drafted, accepted, per_pass)] = SPEC_STAT.findall(client.get(f"/c/{conv_id}").text)
        assert int(drafted) == answer.spec_draft_tokens
        assert int(accepted) == round(100 * answer.spec_accepted_tokens / answer.spec_draft_tokens)
        assert float(per_pass) == pytest.approx(answer.completion_tokens / answer.target_passes, abs=0.01)
        assert float(per_pass) > 1
    app, _ = fake_app(tmp_path / "plain", speculative="off", chat_max_tokens=64, **real)
    with TestClient(app) as client:
        conv_id, answer = answer_in_new_chat(client, prompt)
        assert answer.status == "done" and answer.spec_draft_tokens == 0
        assert answer.target_passes == answer.completion_tokens
        page = client.get(f"/c/{conv_id}").text
        assert "stat-tokens" in page and "stat-spec" not in page
