"""What a user does in the chat page, as reusable steps for the browser tests."""

from __future__ import annotations

import re
import time
from typing import Any

CHAT_URL = re.compile(r"/c/[0-9a-f]+$")


def send_new_chat(page: Any, text: str) -> str:
    """From "/", type a first message, press Enter, and return the new conversation's id."""
    page.goto("/")
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")
    page.wait_for_url(CHAT_URL)
    return page.url.rsplit("/", 1)[1]


def send_new_chat_keeping_settings(page: Any, text: str) -> str:
    """Like `send_new_chat`, but from the page as it is (settings made on "/" go to the new chat)."""
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")
    page.wait_for_url(CHAT_URL)
    return page.url.rsplit("/", 1)[1]


def wait_answer(page: Any, status: str = "done", index: int = -1, timeout_ms: int = 20_000) -> Any:
    """The `index`-th answer, once its status is `status` and its markdown is rendered."""
    answer = page.locator("#messages .msg.assistant").nth(index)
    answer.and_(page.locator(f'[data-status="{status}"][data-rendered]')).wait_for(timeout=timeout_ms)
    return answer


def watch_lengths(page: Any, locator: Any, until: str, timeout_s: float = 20) -> list[int]:
    """Lengths of `locator`'s text seen while polling, until `until` (a selector) appears."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if locator.count():
            length = len(locator.first.inner_text())
            if not seen or seen[-1] != length:
                seen.append(length)
        if page.locator(until).count():
            return seen
        time.sleep(0.03)
    raise AssertionError(f"{until} did not appear; lengths seen: {seen}")


def unlabelled_controls(page: Any) -> list[str]:
    """Visible interactive elements without an accessible name (label, aria-label, text or title)."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll(
              'button, a[href], input:not([type=hidden]), select, textarea, summary'))
            .filter(el => el.getClientRects().length > 0)
            .filter(el => !(el.getAttribute('aria-label') || el.getAttribute('aria-labelledby') ||
                            (el.labels && el.labels.length) || el.textContent.trim() || el.title))
            .map(el => el.outerHTML.slice(0, 120))"""
    )
