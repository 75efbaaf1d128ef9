"""The user's journey in a real browser (chromium, headless) against the live app on the fake backend."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from localchat.chats.records import title_from
from tests.helpers.deadline import wait_until
from tests.ui.actions import (
    CHAT_URL,
    send_new_chat,
    send_new_chat_keeping_settings,
    unlabelled_controls,
    wait_answer,
    watch_lengths,
)

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser


def test_send_streams_the_answer_token_by_token(page: Any, live: Any) -> None:
    reply = "Streaming " + "token by token " * 6
    conv_id = send_new_chat(page, f"<<slow:25>><<say:{reply}>>")
    answer = page.locator("#messages .msg.assistant .answer")
    lengths = watch_lengths(page, answer, '#messages .msg.assistant[data-status="done"]')
    partial = [n for n in lengths if 0 < n < len(reply.strip())]
    assert len(partial) >= 3, f"the answer did not grow in steps: {lengths}"
    expect(answer).to_have_text(reply.strip())
    expect(page.locator(".msg.assistant .stat-tokens")).to_have_text(f"{len(reply) + 1} tokens")
    expect(page.locator(".msg.assistant .stat-speed")).to_contain_text("tok/s")
    expect(page.locator(f"#conv-{conv_id}")).to_be_visible()  # auto-titled in the sidebar
    expect(page.locator(f"#conv-{conv_id} .conv-link")).to_have_text(
        title_from(f"<<slow:25>><<say:{reply}>>")
    )


def test_stop_then_regenerate_then_edit(page: Any, live: Any) -> None:
    # Numbered, so the long answer is not one phrase repeated (the loop guard would end that at 256).
    full = " ".join(f"word{i}" for i in range(50))
    conv_id = send_new_chat(page, f"<<slow:30>><<say:{full}>>")
    answer = page.locator("#messages .msg.assistant")
    expect(page.locator("#stop-btn")).to_be_visible()
    expect(page.locator("#send-btn")).to_be_hidden()
    expect(answer.locator(".answer")).to_contain_text("word0 word1")
    page.click("#stop-btn")
    wait_answer(page, "stopped")
    expect(answer.locator(".msg-note")).to_have_text("Stopped.")
    partial = answer.locator(".answer").inner_text()
    assert 0 < len(partial) < len(full.strip())
    stats = live.ctx.engine.stats
    wait_until(lambda: (stats().num_running, stats().kv_blocks_used) == (0, 0), 5, "stop frees the KV blocks")
    expect(page.locator("#send-btn")).to_be_visible()

    page.click("#messages .msg.assistant .regen")
    expect(answer).to_have_attribute("data-status", "streaming")
    wait_answer(page, "done")
    expect(answer.locator(".answer")).to_have_text(full.strip())

    page.click("#messages .msg.user .edit")
    box = page.locator("#messages .msg.user.editing textarea")
    expect(box).to_be_focused()
    box.fill("<<say:Edited *answer*>>")
    box.press("Enter")
    wait_answer(page, "done")
    expect(page.locator("#messages .msg")).to_have_count(2)  # replaced, not branched
    expect(page.locator("#messages .msg.user .text")).to_have_text("<<say:Edited *answer*>>")
    expect(answer.locator(".answer em")).to_have_text("answer")
    stored = live.web.store.get_messages(conv_id)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "<<say:Edited *answer*>>"),
        ("assistant", "Edited *answer*"),
    ]


def test_reload_mid_answer_and_closed_tab_keep_the_answer(
    browser: Any, live: Any, page: Any, page_errors: Any
) -> None:
    reply = "Persistent answer " * 5
    conv_id = send_new_chat(page, f"<<slow:30>><<say:{reply}>>")
    expect(page.locator("#messages .msg.assistant .answer")).to_contain_text("Persistent")
    page.reload()  # mid-answer: the stream resumes from a snapshot, with nothing lost or doubled
    wait_answer(page, "done")
    expect(page.locator("#messages .msg.assistant .answer")).to_have_text(reply.strip())

    page.fill("#composer-input", "and again")
    page.press("#composer-input", "Enter")
    expect(page.locator("#messages .msg.assistant").nth(1).locator(".answer")).to_contain_text("Persistent")
    page.close()  # the tab goes away mid-answer; the server keeps generating and saving
    wait_until(lambda: not live.web.chats.is_generating(conv_id), 15, "the answer finished")

    from tests.ui.conftest import new_page

    again = new_page(browser, live, page_errors)
    again.goto(f"/c/{conv_id}")
    expect(again.locator("#messages .msg")).to_have_count(4)
    last = again.locator("#messages .msg.assistant").nth(1)
    expect(last).to_have_attribute("data-status", "done")
    expect(last.locator(".answer")).to_have_text(reply.strip())
    expect(last.locator(".stat-tokens")).to_have_text(f"{len(reply) + 1} tokens")
    again.context.close()


def test_new_chat_rename_search_delete_and_theme(page: Any, live: Any) -> None:
    tag = str(time.monotonic_ns())
    first = send_new_chat(page, f"Alpha {tag} <<say:a>>")
    wait_answer(page)
    page.click("#new-chat")
    page.wait_for_url(live.url + "/")
    expect(page.locator("#messages .msg")).to_have_count(0)
    second = send_new_chat(page, f"Beta {tag} <<say:b>>")
    wait_answer(page)
    expect(page.locator(f"#conv-{second}")).to_have_class("conv-item current")

    page.get_by_role("button", name=f"Rename Beta {tag}").click()
    field = page.locator(f"#rename-{second}")
    expect(field).to_be_focused()
    field.fill(f"Renamed {tag}")
    field.press("Enter")
    expect(page.locator(f"#conv-{second} .conv-link")).to_have_text(f"Renamed {tag}")
    expect(page.locator("#chat-title")).to_have_text(f"Renamed {tag}")

    page.fill("#search", f"Alpha {tag}")
    expect(page.locator("#conv-list .conv-item")).to_have_count(1)
    expect(page.locator(f"#conv-{first}")).to_be_visible()
    page.fill("#search", "")
    expect(page.locator(f"#conv-{second}")).to_be_visible()

    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
    page.get_by_role("button", name=f"Delete Alpha {tag}").click()
    expect(page.locator(f"#conv-{first}")).to_have_count(0)
    assert dialogs and f"Alpha {tag}" in dialogs[0]
    page.get_by_role("button", name=f"Delete Renamed {tag}").click()
    page.wait_for_url(live.url + "/")  # deleting the open chat leads to a new one
    assert not [c for c in live.web.store.list_conversations(tag)]

    html = page.locator("html")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.click("#theme-toggle")
    expect(html).to_have_attribute("data-theme", "dark")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != background
    page.reload()
    expect(html).to_have_attribute("data-theme", "dark")  # remembered
    page.click("#theme-toggle")
    expect(html).to_have_attribute("data-theme", "light")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background


def test_keyboard_only_and_labelled_controls(page: Any, live: Any) -> None:
    page.goto("/")
    assert unlabelled_controls(page) == []
    expect(page.locator("#composer-input")).to_be_focused()  # ready to type on arrival
    page.locator(".skip-link").focus()
    page.keyboard.press("Tab")
    expect(page.locator("#new-chat")).to_be_focused()  # the sidebar comes first in the tab order
    page.keyboard.press("Shift+Tab")
    expect(page.locator(".skip-link")).to_be_visible()
    page.keyboard.press("Enter")
    box = page.locator("#composer-input")
    expect(box).to_be_focused()
    page.keyboard.type("line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("<<slow:20>><<say:" + "x" * 80 + ">>")
    assert page.url == live.url + "/#composer-input"  # Shift+Enter is a new line, not a send
    assert box.input_value() == "line one\n<<slow:20>><<say:" + "x" * 80 + ">>"
    page.keyboard.press("Enter")
    page.wait_for_url(CHAT_URL)
    expect(page.locator("#messages .msg.user .text")).to_have_text(
        "line one\n<<slow:20>><<say:" + "x" * 80 + ">>"
    )
    page.locator("#composer-input").focus()
    page.keyboard.press("Escape")  # Esc in the message box stops the answer
    wait_answer(page, "stopped")
    assert unlabelled_controls(page) == []

    page.locator("#settings-open").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#settings")).to_be_visible()
    expect(page.locator("#set-system")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#settings")).to_be_hidden()


def test_thinking_block_updates_live_then_collapses(page: Any, live: Any) -> None:
    send_new_chat(
        page,
        "<<slow:30>><<say:<think>Let me think about this carefully, step by step.</think>The answer is **42**.>>",
    )
    thinking = page.locator("#messages .msg.assistant .thinking")
    expect(thinking).to_be_visible()
    expect(thinking.locator("summary")).to_have_text("Thinking…")
    expect(thinking).to_have_attribute("open", "")
    lengths = watch_lengths(page, thinking.locator(".think-body"), "#messages .msg.assistant .answer strong")
    assert len([n for n in lengths if n > 0]) >= 3, lengths
    wait_answer(page)
    expect(thinking.locator("summary")).to_have_text("Thinking")
    expect(thinking).not_to_have_attribute("open", "")
    expect(page.locator("#messages .msg.assistant .answer")).to_have_text("The answer is 42.")
    thinking.locator("summary").click()
    expect(thinking.locator(".think-body")).to_have_text("Let me think about this carefully, step by step.")


def test_copy_message_and_code(page: Any, live: Any) -> None:
    send_new_chat(page, "<<say:Run:\\n\\n```python\\nprint('hi')\\n```>>")
    answer = wait_answer(page)
    expect(answer.locator(".code-bar span")).to_have_text("python")
    expect(answer.locator("pre code .hljs-built_in")).to_have_text("print")  # highlighted
    answer.get_by_role("button", name="Copy code").click()
    expect(answer.get_by_role("button", name="Copy code")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "print('hi')\n"
    answer.get_by_role("button", name="Copy answer").click()
    assert page.evaluate("navigator.clipboard.readText()") == "Run:\n\n```python\nprint('hi')\n```"


def test_settings_errors_and_export_import(page: Any, live: Any, tmp_path: Path) -> None:
    page.goto("/")
    page.click("#settings-open")
    page.fill("#set-system", "You are terse.")
    page.fill("#set-max-tokens", "5")
    # The same default as the API: the fake model has no generation_config, so the built-in 0.8, and
    # the answer length defaults to --chat-max-tokens.
    expect(page.locator("#set-temperature")).to_have_attribute("placeholder", "0.8")
    expect(page.locator("#set-max-tokens")).to_have_attribute("placeholder", "2048")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings")).to_be_hidden()
    conv_id = send_new_chat_keeping_settings(page, "<<say:abcdefghij>>")
    answer = wait_answer(page)
    expect(answer.locator(".answer")).to_have_text("abcde")
    expect(answer.locator(".msg-note")).to_contain_text("max tokens limit")
    conv = live.web.store.get_conversation(conv_id)
    assert (conv.system_prompt, conv.max_tokens) == ("You are terse.", 5)

    page.click("#settings-open")
    expect(page.locator("#set-max-tokens")).to_have_value("5")
    page.fill("#set-temperature", "0.3")
    page.click("#settings-form button[type=submit]")
    expect(page.locator("#settings-status")).to_contain_text("Saved")
    assert live.web.store.get_conversation(conv_id).temperature == 0.3
    page.keyboard.press("Escape")

    page.click("#export-menu summary")
    with page.expect_download() as download:
        page.click("text=Export as JSON")
    exported = tmp_path / "chat.json"
    download.value.save_as(exported)
    data = json.loads(exported.read_text())
    assert [m["content"] for m in data["messages"]] == ["<<say:abcdefghij>>", "abcde"]
    with page.expect_download() as download:
        page.click("#export-menu summary")
        page.click("text=Export as Markdown")
    assert download.value.suggested_filename.endswith(".md")

    page.goto("/")
    page.set_input_files("#import-file", str(exported))
    page.wait_for_url(CHAT_URL)
    assert page.url.rsplit("/", 1)[1] != conv_id
    expect(page.locator("#messages .msg.assistant .answer")).to_have_text("abcde")

    page.goto("/")
    page.fill("#composer-input", "y" * 5000)  # more tokens than the fake model's context
    page.press("#composer-input", "Enter")
    page.wait_for_url(CHAT_URL)
    error = page.locator("#messages .msg.assistant .msg-error")
    expect(error).to_contain_text("maximum context length is 4096 tokens")
    expect(error.get_by_role("link", name="Start a new chat")).to_have_attribute("href", "/")


def test_a_send_before_htmx_binds_the_form_keeps_the_message(page: Any, live: Any) -> None:
    # htmx present but its DOMContentLoaded pass not run yet (a slow machine): the form is still a plain
    # <form>, and a submit would navigate to "/?content=..." and lose the text. app.js holds it instead.
    page.route("**/vendor/htmx/htmx.min.js", lambda route: route.fulfill(
        content_type="text/javascript", body="window.htmx = {onLoad: function () {}, defineExtension: function () {}};"
    ))  # fmt: skip
    page.goto("/")
    expect(page.locator("html")).not_to_have_attribute("data-ready", "1")
    page.fill("#composer-input", "typed early")
    page.click("#send-btn")
    page.press("#composer-input", "Enter")
    page.wait_for_timeout(300)
    assert "content=" not in page.url and page.url.endswith("/")
    expect(page.locator("#composer-input")).to_have_value("typed early")


def test_the_page_says_when_its_forms_are_bound(page: Any, live: Any) -> None:
    page.goto("/")
    expect(page.locator("html")).to_have_attribute("data-ready", "1")  # what --selftest waits for
