"""The web UI's conversation with a tiny random gpt-oss folder (torch, float32) through the real server's
web routes: the answer is decoded with its special tokens and its harmony channels are stored as the
`<think>` form the page shows as "Thinking", with no marker in the page. The folder, its tokenizer and
its minimal harmony template come from test_gpt_oss_harmony_server.py: greedy decoding writes
`<|channel|>analysis<|message|>ok<|return|>`, so the thinking is "ok" and the answer is empty (decoded
without its special tokens, the answer would have read "analysisok")."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import pytest

from tests.e2e.test_gpt_oss_harmony_server import MAX_TOKENS, write_folder
from tests.helpers.live_server import live_server

pytestmark = pytest.mark.slow
HX = {"HX-Request": "true"}


def test_gpt_oss_answer_in_the_web_ui_is_thinking_then_answer(tmp_path: Path) -> None:
    folder = tmp_path / "gpt-oss-tiny"
    write_folder(folder)
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server(args, ui=True) as server, server.client() as c:
        form = {"content": "Hi", "temperature": "0", "max_tokens": str(MAX_TOKENS)}
        r = c.post("/ui/chats", data=form, headers=HX)
        assert r.status_code == 200, r.text
        conv_id = r.headers["hx-redirect"].rsplit("/", 1)[1]
        deadline = time.monotonic() + 120
        while 'data-status="done"' not in (page := c.get(f"/c/{conv_id}").text):
            assert 'data-status="error"' not in page and time.monotonic() < deadline, page[-2000:]
            time.sleep(0.2)
    raw = re.search(r'data-role="assistant".*?<div class="raw" hidden>(.*?)</div>', page, re.S)
    assert raw is not None, page
    assert html.unescape(raw.group(1)) == "<think>ok</think>"
    assert "&lt;|" not in page and "<|" not in page and "analysis" not in page
