"""The chat page's extras in a real browser: example prompts on an empty chat."""

from __future__ import annotations

from typing import Any

import pytest

from localchat.server.web_extras import EXAMPLE_PROMPTS
from tests.ui.actions import CHAT_URL, wait_answer

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser


def test_an_example_prompt_is_sent_with_one_click(page: Any, live: Any) -> None:
    page.goto("/")
    examples = page.locator("#empty-state .example")
    expect(examples).to_have_count(len(EXAMPLE_PROMPTS))
    title, prompt = EXAMPLE_PROMPTS[0]
    page.get_by_role("button", name=title).click()
    page.wait_for_url(CHAT_URL)
    expect(page.locator(".msg.user .text")).to_have_text(prompt)
    wait_answer(page)
    expect(page.locator("#empty-state")).to_have_count(0)  # a chat with messages has no empty state
