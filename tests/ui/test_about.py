"""The About dialog in a real browser: what it shows, and that it needs no loosening of the CSP (the page
fixture fails on any console error, which is where CSP violations appear)."""

from __future__ import annotations

from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser


def test_about_shows_version_data_dir_log_file_and_device(page: Any, live: Any) -> None:
    from localchat import __version__

    page.goto("/")
    page.get_by_role("button", name="About localchat").click()
    dialog = page.locator("#about")
    expect(dialog).to_be_visible()
    body = dialog.locator("#about-body")
    expect(body).to_contain_text(f"localchat {__version__}")
    expect(body).to_contain_text("localchat.log")
    expect(body).to_contain_text("fake-model")
    expect(body).to_contain_text("the test backend (no model) on CPU")  # in words, not a module name
    expect(body).not_to_contain_text("localchat.backends")
    # Outside the desktop app there is no "serve the API" switch: the server's own flags decide.
    expect(dialog.locator("#serve-api")).to_have_count(0)
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_be_hidden()
