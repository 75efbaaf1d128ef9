"""Details people notice: modal dialogs dim the page behind them, one unit (GB) on the Models page,
a long path in an error page wraps inside its box, and a download of unknown size shows bytes and a
moving (indeterminate) bar rather than a command line and an empty bar."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import pytest

from localchat.server.web.models import _bytes_line, pull_view
from localchat.server.web.render import models_macro
from tests.ui.conftest import PageErrors, new_page

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser

BACKDROP = "(sel) => getComputedStyle(document.querySelector(sel), '::backdrop').backgroundColor"


def test_modal_dialogs_have_a_backdrop(page: Any, live: Any) -> None:
    page.goto("/")
    page.click("#settings-open")
    expect(page.locator("#settings")).to_be_visible()
    assert page.evaluate(BACKDROP, "#settings") not in ("", "transparent", "rgba(0, 0, 0, 0)")
    page.keyboard.press("Escape")
    page.click("#about-open")
    expect(page.locator("#about")).to_be_visible()
    assert page.evaluate(BACKDROP, "#about") not in ("", "transparent", "rgba(0, 0, 0, 0)")


def test_models_page_uses_gb_only(page: Any, live: Any) -> None:
    page.goto("/ui/models")
    text = page.locator("#models-page").inner_text()
    assert "GB" in text and "GiB" not in text


def test_a_long_path_in_an_error_page_wraps(browser: Any, live: Any) -> None:
    page = new_page(browser, live, PageErrors())  # the 404 itself is a console error: not checked here
    response = page.goto("/c/nosuchconversation")
    assert response is not None and response.status == 404
    box = page.locator(".login-card .msg-error")
    path = "/home/someone/" + "a-very-long-directory-name/" * 12 + "localchat.sqlite3"
    box.evaluate("(el, p) => { el.textContent = 'Cannot write to ' + p + ' (read-only file system)'; }", path)
    assert box.evaluate("el => el.scrollWidth <= el.clientWidth"), "the path overflows its box"
    page.context.close()


class _Job:
    name = "smollm2"
    progress: ClassVar[dict[str, Any]] = {
        "phase": "downloading",
        "done_bytes": 0,
        "total_bytes": None,
        "message": "x==1 from the index",
    }


def test_a_download_of_unknown_size_shows_bytes_and_a_moving_bar() -> None:
    assert _bytes_line({"done_bytes": 12_500_000}) == "12.5 MB so far"
    assert _bytes_line({"done_bytes": 5_000_000, "total_bytes": 10_000_000}).startswith("5.0 MB / 10.0 MB")
    html = models_macro("pull_progress", pull_view(_Job()))  # type: ignore[arg-type]
    bar = re.search(r"<progress[^>]*>", html)
    assert bar and "value=" not in bar[0]  # no value: the browser animates the bar
    assert "pip download" not in html
