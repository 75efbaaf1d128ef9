"""MCP in the web UI (Debian's chromium): the settings dialog lists the connected servers and their
tools; each MCP call waits for the user's Allow / Deny / Always allow (Stop ends the wait); an answer
that runs MCP tools shows each call and its result as a collapsed block, the result as plain text."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from localchat.mcp.trust import DENIED
from tests.helpers.live_server import REPO
from tests.ui.actions import send_new_chat, wait_answer
from tests.ui.conftest import PageErrors, new_page
from tests.ui.web_app import LiveApp, live_app

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser

CALC_SERVER = REPO / "tests" / "helpers" / "mcp_calc_server.py"
ADD = '<<say:{"name": "add", "arguments": {"a": 2, "b": 3}}>>'


@pytest.fixture(scope="module")
def mcp_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApp]:
    home = tmp_path_factory.mktemp("ui-mcp")
    config = home / "mcp.json"
    config.write_text(
        json.dumps(
            {"mcpServers": {"calc": {"command": sys.executable, "args": [str(CALC_SERVER)], "autoUse": True}}}
        )
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
    expect(panel.locator(".mcp-auto")).to_have_text("used in chats")
    expect(panel.locator(".mcp-tools code")).to_have_text(["add", "explode", "markup"])


def approve(page: Any, decision: str = "Allow") -> None:
    """Wait for the card that asks before the answer's next MCP call, and decide."""
    card = page.locator(".msg.assistant .tool-approval")
    expect(card).to_be_visible(timeout=15_000)
    # This card's own id: the model may ask its next question (a new card) as soon as this one is answered.
    this_card = page.locator(f'.tool-approval[data-approval="{card.get_attribute("data-approval")}"]')
    this_card.get_by_role("button", name=decision, exact=True).click()
    expect(this_card).to_have_count(0, timeout=15_000)


def test_allow_runs_the_tool_and_shows_the_run_as_collapsed_blocks(mcp_page, mcp_live):
    send_new_chat(mcp_page, ADD)
    card = mcp_page.locator(".msg.assistant .tool-approval")
    expect(card).to_be_visible(timeout=15_000)
    expect(card.locator(".tool-approval-title")).to_contain_text("add")
    expect(card.locator(".tool-approval-args")).to_have_text(json.dumps({"a": 2, "b": 3}, indent=2))
    assert mcp_page.locator(".msg.assistant .tool-block.tool-result").count() == 0  # nothing ran yet
    mcp_page.reload()  # the question outlives the tab: a reloaded page asks it again
    expect(card).to_be_visible(timeout=15_000)
    approve(mcp_page, "Allow")
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
    approve(mcp_page, "Allow")
    # The result scripts no reply, so the fake model calls again: stop there.
    expect(mcp_page.locator(".msg.assistant .tool-approval")).to_be_visible(timeout=15_000)
    mcp_page.click("#stop-btn")
    answer = wait_answer(mcp_page, status="stopped")
    result = answer.locator(".tool-block.tool-result")
    expect(result.first.locator("summary")).to_have_text("Tool result: markup")
    result.first.locator("summary").click()
    expect(result.first.locator("pre")).to_contain_text('<img src=x onerror="window.__xss=1">')
    assert answer.locator(".answer img, .answer script").count() == 0
    assert mcp_page.evaluate("() => window.__xss") is None


def test_deny_tells_the_model_and_the_answer_goes_on(mcp_page):
    send_new_chat(mcp_page, ADD)
    approve(mcp_page, "Deny")
    # The model reads the refusal; the fake model then asks again (its script is the user's message),
    # which shows that the answer went on after the denial. Allowing that second call finishes it.
    denied = mcp_page.locator(".msg.assistant .tool-block.denied")
    expect(denied.locator("summary")).to_have_text("Denied: add", timeout=15_000)
    denied.locator("summary").click()
    expect(denied.locator("pre")).to_have_text(DENIED)
    approve(mcp_page, "Allow")
    answer = wait_answer(mcp_page)
    expect(answer.locator(".answer")).to_contain_text("The sum is 5.")
    expect(answer.locator(".tool-block.denied")).to_have_count(1)
    expect(answer.locator(".tool-block.tool-result:not(.failed)")).to_have_count(1)


def test_stop_during_a_pending_approval_ends_the_answer(mcp_page, mcp_live):
    send_new_chat(mcp_page, ADD)
    expect(mcp_page.locator(".msg.assistant .tool-approval")).to_be_visible(timeout=15_000)
    mcp_page.click("#stop-btn")
    answer = wait_answer(mcp_page, status="stopped")
    expect(answer.locator(".msg-note")).to_have_text("Stopped.")
    expect(answer.locator(".tool-approval")).to_have_count(0)
    expect(answer.locator(".tool-block.tool-result")).to_contain_text("Not run")  # the tool never ran
    expect(mcp_page.locator("body.busy")).to_have_count(0)


def test_always_allow_is_remembered(mcp_page, mcp_live):
    # Last in the module: from here on, add runs without asking.
    send_new_chat(mcp_page, ADD)
    approve(mcp_page, "Always allow this tool")
    expect(wait_answer(mcp_page).locator(".answer")).to_contain_text("The sum is 5.")
    path = mcp_live.web.chats.consent.path
    assert json.loads(path.read_text()) == {"always_allow": {"calc": ["add"]}}
    assert os.stat(path).st_mode & 0o777 == 0o600
    # After a reload, a new chat's call runs at once: no card.
    mcp_page.reload()
    send_new_chat(mcp_page, ADD)
    answer = wait_answer(mcp_page)
    expect(answer.locator(".answer")).to_contain_text("The sum is 5.")
    expect(answer.locator(".tool-block")).to_have_count(2)
    assert mcp_page.locator(".tool-approval").count() == 0
