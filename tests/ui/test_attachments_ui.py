"""Attachments in a real browser: a .txt and a PDF attached by the button, by drag-and-drop and by paste
reach the prompt (the fake model answers with the file's script), thumbnails and chips can be removed
before sending, refusals are readable, and the files are on the message after a reload."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.tiny_pdf import tiny_pdf
from tests.ui.actions import CHAT_URL, wait_answer
from tests.unit.test_attachments import png

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
expect = sync_api.expect
pytestmark = pytest.mark.browser


def _file(name: str, data: bytes, mime: str) -> dict[str, Any]:
    return {"name": name, "mimeType": mime, "buffer": data}


def _send(page: Any, text: str) -> None:
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")


def test_a_pdf_and_a_text_file_reach_the_prompt_and_stay_on_the_message(page: Any, live: Any) -> None:
    page.goto("/")
    # The button adds to what is attached; a file can be removed before sending.
    page.set_input_files("#attach-input", [_file("wrong.txt", b"<<say:wrong file>>", "text/plain")])
    page.set_input_files("#attach-input", [_file("notes.txt", b"<<say:read the txt>>", "text/plain")])
    expect(page.locator("#attach-list .name")).to_have_text(["wrong.txt", "notes.txt"])
    page.get_by_role("button", name="Remove wrong.txt").click()
    expect(page.locator("#attach-list .name")).to_have_text(["notes.txt"])
    _send(page, "What does it say?")
    page.wait_for_url(CHAT_URL)
    expect(wait_answer(page).locator(".answer")).to_have_text("read the txt")  # the file's script
    expect(page.locator("#attach-list .attach-item")).to_have_count(0)  # sent: the composer is empty again
    page.reload()
    expect(page.locator(".msg.user .msg-attachments .name")).to_have_text(["notes.txt"])

    page.goto("/")
    pdf = tiny_pdf("<<say:read the pdf>>")
    page.set_input_files("#attach-input", [_file("paper.pdf", pdf, "application/pdf")])
    _send(page, "And this one?")
    page.wait_for_url(CHAT_URL)
    expect(wait_answer(page).locator(".answer")).to_have_text("read the pdf")
    page.reload()
    expect(page.locator(".msg.user .msg-attachments .name")).to_have_text(["paper.pdf"])
    [user, _] = live.web.store.get_messages(page.url.rsplit("/", 1)[1])
    assert [(a.name, a.text) for a in user.attachments] == [("paper.pdf", "<<say:read the pdf>>")]


def test_drop_and_paste_attach_files(page: Any, live: Any) -> None:
    page.goto("/")
    dropped = page.evaluate_handle(
        "() => { const dt = new DataTransfer();"
        " dt.items.add(new File(['<<say:dropped>>'], 'drop.md', {type: 'text/markdown'})); return dt; }"
    )
    page.dispatch_event("#main", "dragover", {"dataTransfer": dropped})
    page.dispatch_event("#main", "drop", {"dataTransfer": dropped})
    expect(page.locator("#attach-list .name")).to_have_text(["drop.md"])
    page.evaluate(
        "() => { const dt = new DataTransfer();"
        " dt.items.add(new File(['a,b\\n1,2'], 'table.csv', {type: 'text/csv'}));"
        " document.getElementById('composer-input').dispatchEvent("
        "new ClipboardEvent('paste', {clipboardData: dt, bubbles: true, cancelable: true})); }"
    )
    expect(page.locator("#attach-list .name")).to_have_text(["drop.md", "table.csv"])
    _send(page, "")  # files alone are a message
    page.wait_for_url(CHAT_URL)
    expect(wait_answer(page).locator(".answer")).to_have_text("dropped")


def test_refusals_are_readable(page: Any, live: Any, page_errors: Any) -> None:
    page.goto("/")
    page.set_input_files("#attach-input", [_file("cat.png", png(), "image/png")])
    expect(page.locator("#notice")).to_contain_text(
        "fake-model does not see images, so cat.png cannot be sent"
    )
    page.set_input_files("#attach-input", [_file("logo.svg", b"<svg/>", "image/svg+xml")])
    expect(page.locator("#notice")).to_contain_text("logo.svg: SVG files are not accepted")
    expect(page.locator("#attach-list .attach-item")).to_have_count(0)
    # What only the server can tell (a binary file) comes back as a notice too, and nothing is sent.
    page.set_input_files("#attach-input", [_file("tool.bin", bytes(range(256)), "application/octet-stream")])
    _send(page, "run it")
    expect(page.locator("#notice")).to_contain_text("tool.bin is a binary file the chat cannot read")
    assert page.url.endswith("/")
    assert all("400" in error for error in page_errors.errors)  # the refused send, and nothing else
    page_errors.errors.clear()
