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


def test_presets_fill_the_settings_and_a_default_system_prompt_starts_new_chats(page: Any, live: Any) -> None:
    page.goto("/")
    page.click("#settings-open")
    page.fill("#set-system", "Answer like a pirate.")
    page.fill("#set-temperature", "0.4")
    page.fill("#set-max-tokens", "128")
    page.fill("#preset-name", "Pirate")
    page.click("#preset-save")
    expect(page.locator("#preset-select option", has_text="Pirate")).to_have_count(1)
    for field in ("#set-system", "#set-temperature", "#set-max-tokens"):
        page.fill(field, "")
    page.select_option("#preset-select", "")
    page.select_option("#preset-select", "Pirate")
    expect(page.locator("#set-system")).to_have_value("Answer like a pirate.")
    expect(page.locator("#set-temperature")).to_have_value("0.4")
    expect(page.locator("#set-max-tokens")).to_have_value("128")

    page.click("#default-system-save")
    expect(page.locator("#settings-status")).to_contain_text("New chats now start with this system prompt")
    page.goto("/")  # a new chat: the default is filled in, and the first message stores it
    page.click("#settings-open")
    expect(page.locator("#set-system")).to_have_value("Answer like a pirate.")
    expect(page.locator("#preset-select option", has_text="Pirate")).to_have_count(1)  # presets persist
    page.keyboard.press("Escape")
    page.fill("#composer-input", "Hello there")
    page.press("#composer-input", "Enter")
    page.wait_for_url(CHAT_URL)
    conv = live.web.store.get_conversation(page.url.rsplit("/", 1)[1])
    assert conv.system_prompt == "Answer like a pirate."

    page.click("#settings-open")
    page.select_option("#preset-select", "Pirate")
    page.click("#preset-delete")
    expect(page.locator("#preset-select option", has_text="Pirate")).to_have_count(0)
    page.fill("#set-system", "")
    page.click("#default-system-save")
    expect(page.locator("#settings-status")).to_contain_text("New chats start with none")
