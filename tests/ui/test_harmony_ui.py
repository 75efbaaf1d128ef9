"""gpt-oss's harmony format in the chat page (chromium, headless): the analysis channel streams into the
same "Thinking" block a `<think>` model's reasoning uses, the final channel is the answer, and no harmony
marker is shown. The fake backend speaks harmony here (`tool_call_parser="harmony"`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.actions import send_new_chat, wait_answer, watch_lengths
from tests.ui.web_app import LiveApp, live_app

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser

REASONING = "Let me think about this carefully, step by step."
HARMONY = (
    f"<|channel|>analysis<|message|>{REASONING}<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is **42**."
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApp]:
    """The app with a model that speaks harmony (replaces the package's plain fake model here)."""
    home: Path = tmp_path_factory.mktemp("ui-harmony")
    with live_app(home, tool_call_parser="harmony") as app:
        yield app


def test_harmony_channels_show_as_thinking_and_answer(page: Any, live: LiveApp) -> None:
    send_new_chat(page, f"<<slow:30>><<say:{HARMONY}>>")
    answer = page.locator("#messages .msg.assistant")
    thinking = answer.locator(".thinking")
    expect(thinking).to_be_visible()
    expect(thinking.locator("summary")).to_have_text("Thinking…")
    lengths = watch_lengths(page, thinking.locator(".think-body"), "#messages .msg.assistant .answer strong")
    assert len([n for n in lengths if n > 0]) >= 3, lengths  # the reasoning streamed
    wait_answer(page)
    expect(thinking.locator("summary")).to_have_text("Thinking")
    expect(answer.locator(".answer")).to_have_text("The answer is 42.")
    thinking.locator("summary").click()
    expect(thinking.locator(".think-body")).to_have_text(REASONING)
    for html in (answer.inner_html(), answer.inner_text()):
        assert "<|" not in html and "&lt;|" not in html and "analysis" not in html, html
    # The only markers on the page are in copies of what the user typed (the fake model's script: the
    # question, the title, the sidebar), never in the answer's text.
    assert _marker_texts_outside_the_script(page) == []
    page.reload()  # the stored answer renders the same
    expect(page.locator("#messages .msg.assistant .answer")).to_have_text("The answer is 42.")
    expect(page.locator("#messages .msg.assistant .think-body")).to_have_text(REASONING)


def _marker_texts_outside_the_script(page: Any) -> list[str]:
    """Texts of the page (text nodes and attributes) that hold a harmony marker but not `<<say:`."""
    return list(
        page.evaluate(
            """() => {
              const bad = text => text.includes("<|") && !text.includes("<<say:");
              const found = [];
              const walk = document.createTreeWalker(document.documentElement, NodeFilter.SHOW_TEXT);
              while (walk.nextNode())
                if (bad(walk.currentNode.textContent)) found.push(walk.currentNode.textContent.slice(0, 200));
              for (const el of document.querySelectorAll("*"))
                for (const attr of el.attributes)
                  if (bad(attr.value)) found.push(el.outerHTML.slice(0, 200));
              return found;
            }"""
        )
    )
