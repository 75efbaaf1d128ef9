"""The chat page's extras in a real browser: example prompts on an empty chat, presets and the default
system prompt, per-message delete, keyboard shortcuts and the banner of a stopped server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localchat.server.web.extras import EXAMPLE_PROMPTS
from tests.ui.actions import CHAT_URL, send_new_chat, send_new_chat_keeping_settings, wait_answer
from tests.ui.conftest import NARROW, SCREENSHOTS, PageErrors, new_page
from tests.ui.web_app import live_app

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


def test_delete_one_message_then_another(page: Any, live: Any) -> None:
    conv_id = send_new_chat(page, "Delete me later")
    wait_answer(page)
    page.locator("#messages .msg.user").hover()
    page.get_by_role("button", name="Delete message").click()
    expect(page.locator("#messages .msg.user")).to_have_count(0)
    assert [m.role for m in live.web.store.get_messages(conv_id)] == ["assistant"]
    page.reload()
    page.get_by_role("button", name="Delete answer").click()
    expect(page.locator("#messages .msg")).to_have_count(0)
    assert live.web.store.get_messages(conv_id) == []


def test_keyboard_shortcuts_and_their_dialog(page: Any, live: Any) -> None:
    page.goto("/")
    page.locator("#chat-title").click()  # out of the message box (autofocused), where "?" is text
    page.keyboard.press("?")
    dialog = page.locator("#shortcuts")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("New chat")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Keyboard shortcuts (?)").click()
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_be_hidden()

    send_new_chat(page, "<<slow:40>><<say:" + "word " * 80 + ">>")
    expect(page.locator("#stop-btn")).to_be_visible()
    page.locator("#chat-title").click()  # focus out of the message box
    page.keyboard.press("Escape")  # Esc stops the answer from anywhere on the page
    wait_answer(page, "stopped")
    page.locator("#chat-title").click()
    page.keyboard.press("/")
    expect(page.locator("#composer-input")).to_be_focused()
    expect(page.locator("#composer-input")).to_have_value("")  # the "/" was not typed


def test_a_stopped_server_shows_a_banner(browser: Any, tmp_path: Path) -> None:
    errors = PageErrors()  # the refused polls are console errors here, and expected
    with live_app(tmp_path / "home") as app:
        page = new_page(browser, app, errors)
        page.goto("/")
        page.wait_for_timeout(3500)  # one poll while the server runs: no banner
        expect(page.locator("#server-banner")).to_have_count(0)
    expect(page.locator("#server-banner")).to_contain_text("localchat has stopped", timeout=10_000)
    page.context.close()


def test_regenerate_keeps_versions_to_step_through_and_compare(page: Any, live: Any) -> None:
    # The fake model says what the system prompt's script tells it: one script per version.
    page.goto("/")
    page.click("#settings-open")
    page.fill("#set-system", "<<say:Version one>>")
    page.click("#settings-form button[type=submit]")
    conv_id = send_new_chat_keeping_settings(page, "Tell me something")
    answer = wait_answer(page)
    expect(answer.locator(".answer")).to_have_text("Version one")
    expect(answer.locator(".versions")).to_have_count(0)  # one version: no arrows
    live.web.store.update_settings(conv_id, system_prompt="<<say:Version two>>")
    page.click("#messages .msg.assistant .regen")
    answer = wait_answer(page)
    expect(answer.locator(".answer")).to_have_text("Version two")
    expect(answer.locator(".version-place")).to_have_text("2/2")

    page.get_by_role("button", name="Previous version").click()
    answer = wait_answer(page)
    expect(answer.locator(".answer")).to_have_text("Version one")
    expect(answer.locator(".version-place")).to_have_text("1/2")
    assert live.web.store.get_messages(conv_id)[-1].content == "Version one"  # the chat goes on from it
    expect(page.get_by_role("button", name="Previous version")).to_be_disabled()

    page.get_by_role("button", name="Compare the versions").click()
    dialog = page.locator("#compare")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".compare-col")).to_have_count(2)
    expect(dialog.locator(".compare-col.current .compare-text")).to_have_text("Version one")
    expect(dialog.locator(".compare-col.current .compare-text p")).to_have_count(1)  # rendered markdown
    expect(dialog).to_contain_text("Version two")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "compare-wide.png"))
    dialog.get_by_role("button", name="Close").click()
    page.get_by_role("button", name="Next version").click()
    expect(wait_answer(page).locator(".answer")).to_have_text("Version two")
    page.set_viewport_size(NARROW)
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(SCREENSHOTS / "versions-dark-narrow.png"))
