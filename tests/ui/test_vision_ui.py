"""A picture through the web UI to a vision model, in a real browser against `localchat serve` (a separate
process, torch backend, float32) on the tiny random Gemma 3 vision folder of tests/e2e/test_vision_server:
the answer is transformers' greedy answer for the same picture and words, and the thumbnail is on the
message after a reload (loaded through the gated attachment route)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_vision_server import MAX_TOKENS, QUESTION, _hf_answer, _pictures, _write_folder
from tests.helpers.live_server import LiveServer, live_server
from tests.ui.actions import CHAT_URL, wait_answer
from tests.ui.conftest import WIDE, PageErrors

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, LiveServer]]:
    folder = tmp_path_factory.mktemp("gemma3-vision-ui")
    hf = _write_folder(folder)
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server(args, ui=True) as server:
        yield hf, folder, server


def test_a_picture_is_answered_and_its_thumbnail_stays(
    browser: Any, gemma: tuple[Any, Path, LiveServer], page_errors: PageErrors
) -> None:
    hf, folder, server = gemma
    picture = _pictures(folder)[0]
    context = browser.new_context(base_url=server.base_url, viewport=WIDE)
    context.set_default_timeout(10_000)
    page = context.new_page()
    page_errors.attach(page)
    page.goto("/")
    expect(page.locator("#model-select option[data-vision='1']")).to_contain_text("sees images")
    # Greedy, and as many tokens as the reference: the conversation's settings, as the dialog sets them.
    page.evaluate(
        "([n]) => { document.getElementById('set-temperature').value = '0';"
        " document.getElementById('set-max-tokens').value = String(n); }",
        [MAX_TOKENS],
    )
    page.set_input_files("#attach-input", str(picture))
    expect(page.locator("#attach-list img.thumb")).to_have_count(1)
    page.wait_for_function("() => document.querySelector('#attach-list img.thumb').naturalWidth > 0")
    page.fill("#composer-input", QUESTION)
    page.press("#composer-input", "Enter")
    page.wait_for_url(CHAT_URL, timeout=60_000)
    wait_answer(page, timeout_ms=120_000)
    conv_id = page.url.rsplit("/", 1)[1]
    exported = json.loads(page.request.get(f"/ui/c/{conv_id}/export/json").text())
    answer = exported["messages"][-1]
    assert answer["status"] == "done", answer
    assert answer["content"].strip() and answer["content"].strip() == _hf_answer(hf, picture).strip()
    assert answer["usage"]["prompt_tokens"] > 4 + len(QUESTION.split()), "the picture's tokens are counted"

    page.reload()
    thumb = page.locator(".msg.user .msg-attachments img.thumb")
    expect(thumb).to_have_count(1)
    thumb.evaluate("img => img.decode()")
    assert thumb.evaluate("img => img.naturalWidth") > 0  # loaded through /ui/attachments
    page.context.close()
    assert not page_errors.errors, page_errors.errors
