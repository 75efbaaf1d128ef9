"""Signing in with an API key from a real browser (issue #27): Chromium, a real `localchat serve
--api-key`, the login form's own POST (which Chromium sent with `Origin: null` while every page asked
for no referrer, and the security gate refused), then a chat."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.live_server import LiveServer, live_server
from tests.ui.conftest import PageErrors

pytestmark = pytest.mark.browser
KEY = "a-key-for-the-browser-test"


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[LiveServer]:
    with live_server(["--backend", "fake"], ui=True, api_key=KEY) as srv:
        yield srv


def test_sign_in_with_the_key_then_chat(browser: Any, keyed_server: LiveServer) -> None:
    errors = PageErrors()
    context = browser.new_context(base_url=keyed_server.base_url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors.attach(page)
    posts: list[dict[str, str]] = []
    page.on("request", lambda r: r.method == "POST" and r.url.endswith("/login") and posts.append(r.headers))
    try:
        page.goto("/")
        page.wait_for_url("**/login**")
        page.fill("#api-key", "not-the-key")
        page.click("button[type=submit]")
        page.get_by_role("alert").wait_for()  # a wrong key: the form again, with the reason
        assert "not the one" in page.get_by_role("alert").inner_text()
        errors.errors.clear()  # the browser logs that 401 as a console error; it was meant

        page.fill("#api-key", KEY)
        page.click("button[type=submit]")
        page.wait_for_selector("#composer-input")
        # The page's own origin, not "null": what the Referrer-Policy decides, and the gate accepts.
        assert [h.get("origin") for h in posts] == [keyed_server.base_url] * 2, posts
        page.fill("#composer-input", "<<say:signed in and chatting>>")
        page.click("#send-btn")
        answer = page.locator(".msg.assistant[data-status=done]").last
        answer.wait_for(timeout=20_000)
        answer.locator(".answer", has_text="signed in and chatting").wait_for()
        assert not errors.errors, errors.errors
    finally:
        context.close()
