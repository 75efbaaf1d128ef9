"""Browser fixtures: Debian's chromium driven by Playwright (never `playwright install`), against the
real app on the fake backend served live on 127.0.0.1."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.web_app import LiveApp, live_app

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 780}
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"


# Package scope, not session: Playwright's sync API keeps an asyncio loop running in the main thread while
# it is open, so a session-wide browser made every later test's asyncio.run() fail (tests/unit runs after).
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApp]:
    with live_app(tmp_path_factory.mktemp("ui-home")) as app:
        yield app


class PageErrors:
    """JavaScript errors and console errors (CSP violations show up there) seen by a page."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def attach(self, page: Any) -> None:
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}"))


@pytest.fixture
def page_errors() -> PageErrors:
    return PageErrors()


def new_page(
    browser: Any, live: LiveApp, errors: PageErrors, viewport: dict[str, int] = WIDE, **options: Any
) -> Any:
    context = browser.new_context(base_url=live.url, viewport=viewport, **options)
    context.set_default_timeout(10_000)
    page = context.new_page()
    errors.attach(page)
    return page


@pytest.fixture
def page(browser: Any, live: LiveApp, page_errors: PageErrors) -> Iterator[Any]:
    page = new_page(browser, live, page_errors, permissions=["clipboard-read", "clipboard-write"])
    yield page
    page.context.close()
    assert not page_errors.errors, page_errors.errors
