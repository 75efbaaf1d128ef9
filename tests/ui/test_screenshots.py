"""Screenshots of the main states at a wide and a narrow width, in test-output/screenshots/ (for review;
the assertions check what must hold at each width, e.g. the sidebar collapsing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.ui.actions import send_new_chat, send_new_chat_keeping_settings, wait_answer
from tests.ui.conftest import NARROW, SCREENSHOTS, WIDE, new_page
from tests.ui.web_app import LiveApp, live_app

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser

# The fake backend answers with the script it finds in the prompt; putting it in the system prompt
# keeps the user's message in the shots natural.
THINKING = (
    "<<slow:40>><<say:<think>The user wants an example. A short Python function with a docstring will do, "
    "then one line on how to call it.</think>Here is a function:\\n\\n```python\\ndef greet(name: str) -> str:\\n"
    '    """Say hello."""\\n    return f"Hello, {name}!"\\n```\\n\\nCall it as `greet("Ada")`.>>'
)
LONG_PASTE = (
    "Summarise this meeting transcript.\n\n"
    + (
        "Alice: we should ship on Friday. Bob: the tests are not green yet, and the installer still needs "
        "signing. Carol: I can take the installer. "
    )
    * 40
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApp]:
    """Its own server and data dir, so the sidebar shows only the conversations made here."""
    with live_app(tmp_path_factory.mktemp("screenshots-home")) as app:
        yield app


def _shot(page: Any, name: str) -> None:
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 5_000, f"{path} looks empty"


def test_screenshots_of_the_main_states(browser: Any, fresh: LiveApp, page_errors: Any) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    wide = new_page(browser, fresh, page_errors, WIDE)
    wide.goto("/")
    _shot(wide, "empty-wide")
    chat = send_new_chat(wide, "Show me what you can do")  # the fake's default reply: markdown, code, a list
    wait_answer(wide)
    wide.fill("#composer-input", "Thanks! Can you explain it?")
    wide.press("#composer-input", "Enter")
    wait_answer(wide, index=1)
    expect(wide.locator("#sidebar")).to_be_visible()
    _shot(wide, "chat-wide")

    wide.click("#settings-open")
    wide.fill("#set-system", "You are a concise, friendly assistant.")
    wide.fill("#set-temperature", "0.7")
    expect(wide.locator("#settings")).to_be_visible()
    _shot(wide, "settings-wide")
    wide.keyboard.press("Escape")

    wide.goto("/")
    wide.click("#settings-open")
    wide.fill("#set-system", THINKING)
    wide.click("#settings-form button[type=submit]")
    expect(wide.locator("#settings")).to_be_hidden()
    streaming = send_new_chat_keeping_settings(wide, "Can you show me a small Python function?")
    expect(wide.locator(".thinking .think-body")).to_contain_text("short Python")
    _shot(wide, "thinking-streaming-wide")
    wait_answer(wide)
    _shot(wide, "thinking-done-wide")

    wide.goto(f"/c/{chat}")
    wait_answer(wide)
    wide.click("#theme-toggle")
    _shot(wide, "chat-dark-wide")
    wide.click("#about-open")
    expect(wide.locator("#about-body .about-facts")).to_be_visible()
    _shot(wide, "about-dark-wide")
    wide.click("#about-close")
    wide.click("#shortcuts-open")
    expect(wide.locator("#shortcuts")).to_be_visible()
    _shot(wide, "shortcuts-dark-wide")
    wide.keyboard.press("Escape")
    wide.click("#theme-toggle")
    wide.goto("/ui/models")
    _shot(wide, "models-wide")

    send_new_chat(wide, LONG_PASTE)
    expect(wide.locator(".msg-error")).to_be_visible()
    _shot(wide, "error-context-too-long-wide")
    wide.context.close()

    narrow = new_page(browser, fresh, page_errors, NARROW)
    narrow.goto("/")
    box = narrow.locator("#sidebar").bounding_box()
    assert box is None or box["x"] + box["width"] <= 0, "a narrow window starts with the sidebar collapsed"
    _shot(narrow, "empty-narrow")
    narrow.goto(f"/c/{chat}")
    wait_answer(narrow)
    _shot(narrow, "chat-narrow")
    narrow.click("#sidebar-toggle")
    expect(narrow.locator("#sidebar")).to_be_in_viewport()
    expect(narrow.locator("#sidebar-toggle")).to_have_attribute("aria-expanded", "true")
    narrow.wait_for_timeout(250)  # the slide-in transition
    _shot(narrow, "sidebar-open-narrow")
    narrow.keyboard.press("Escape")
    expect(narrow.locator("#sidebar")).not_to_be_in_viewport()
    narrow.goto(f"/c/{streaming}")
    wait_answer(narrow)
    narrow.locator(".thinking summary").click()
    _shot(narrow, "thinking-open-narrow")
    narrow.click("#theme-toggle")
    _shot(narrow, "chat-dark-narrow")
    narrow.goto("/")
    _shot(narrow, "empty-dark-narrow")
    narrow.context.close()
    assert not page_errors.errors, page_errors.errors
