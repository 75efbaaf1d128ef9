"""MCP in the web UI (Debian's chromium): the settings dialog lists the connected servers and their
tools, and an answer that runs MCP tools shows each call and its result as a collapsed block,
with the result as plain text, never HTML."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.live_server import REPO
from tests.ui.actions import send_new_chat, wait_answer
from tests.ui.conftest import PageErrors, new_page
from tests.ui.web_app import LiveApp, live_app

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser

CALC_SERVER = REPO / "tests" / "helpers" / "mcp_calc_server.py"


@pytest.fixture(scope="module")
def mcp_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApp]:
    home = tmp_path_factory.mktemp("ui-mcp")
    config = home / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(CALC_SERVER)]}}})
    )
    with live_app(home, mcp_config=str(config)) as app:
        yield app


@pytest.fixture
def mcp_page(browser: Any, mcp_live: LiveApp) -> Iterator[Any]:
    errors = PageErrors()
    page = new_page(browser, mcp_live, errors)
    yield page
    page.context.close()
    assert not errors.errors, errors.errors


def test_settings_list_the_mcp_servers_and_tools(mcp_page):
    mcp_page.goto("/")
    mcp_page.click("#settings-open")
    panel = mcp_page.locator("#mcp-servers")
    expect(panel).to_be_visible()
    expect(panel.locator(".mcp-server")).to_contain_text("calc")
    expect(panel.locator(".mcp-status")).to_have_text("connected")
    expect(panel.locator(".mcp-tools code")).to_have_text(["add", "explode", "markup"])


def test_an_answer_shows_tool_runs_as_collapsed_blocks(mcp_page, mcp_live):
    send_new_chat(mcp_page, '<<say:{"name": "add", "arguments": {"a": 2, "b": 3}}>>')
    answer = wait_answer(mcp_page)
    call, result = answer.locator(".tool-block").all()
    expect(call.locator("summary")).to_have_text("Tool call: add")
    expect(result.locator("summary")).to_have_text("Tool result: add")
    assert call.get_attribute("open") is None  # collapsed until clicked
    call.locator("summary").click()
    expect(call.locator("pre")).to_have_text(json.dumps({"a": 2, "b": 3}, indent=2))
    expect(answer.locator(".answer")).to_contain_text("The sum is 5.")
    # The stored answer holds the run, so a reload shows the same blocks.
    mcp_page.reload()
    expect(wait_answer(mcp_page).locator(".tool-block")).to_have_count(2)


def test_tool_results_are_text_not_html(mcp_page):
    send_new_chat(mcp_page, '<<say:{"name": "markup", "arguments": {}}>>')
    answer = wait_answer(mcp_page)
    result = answer.locator(".tool-block.tool-result")
    expect(result.first.locator("summary")).to_have_text("Tool result: markup")
    result.first.locator("summary").click()
    expect(result.first.locator("pre")).to_contain_text('<img src=x onerror="window.__xss=1">')
    assert answer.locator(".answer img, .answer script").count() == 0
    assert mcp_page.evaluate("() => window.__xss") is None
