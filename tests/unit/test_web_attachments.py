"""Attachments through the web UI's routes (the real app on the fake backend, no browser): documents reach
the prompt, refusals are readable notices, pictures are served only as what they are."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from localchat.attachments.prepare import AttachmentRules, Upload, prepare
from localchat.chats.records import NewMessage
from tests.helpers.tiny_pdf import tiny_pdf
from tests.ui.web_app import fake_app, web_state
from tests.unit.test_attachments import png

HX = {"HX-Request": "true"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app, _ = fake_app(tmp_path)
    with TestClient(app) as c:
        yield c


def _send(client: TestClient, content: str, files: list[tuple[str, bytes]]) -> Any:
    parts = [("files", (name, data, "application/octet-stream")) for name, data in files]
    return client.post("/ui/chats", data={"content": content}, files=parts, headers=HX)


def _answer(client: TestClient, response: Any) -> tuple[Any, Any]:
    assert response.status_code == 200, response.text
    conv_id = response.headers["hx-redirect"].rsplit("/", 1)[1]
    web = web_state(client.app)
    deadline = time.monotonic() + 10
    while web.chats.is_generating(conv_id):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    user, answer = web.store.get_messages(conv_id)
    return user, answer


def test_text_and_pdf_files_reach_the_prompt(client: TestClient) -> None:
    # The fake model answers with the first <<say:...>> script in its prompt: here, the text file's.
    user, answer = _answer(client, _send(client, "", [("notes.txt", b"line one\n<<say:from the txt>>")]))
    assert answer.content == "from the txt"
    assert [(a.name, a.kind) for a in user.attachments] == [("notes.txt", "document")]
    _, answer = _answer(
        client, _send(client, "Summarize it.", [("paper.pdf", tiny_pdf("<<say:from the pdf>>"))])
    )
    assert answer.content == "from the pdf"
    assert answer.prompt_tokens > len("File: paper.pdf")


def test_a_long_document_is_cut_and_the_page_says_so(client: TestClient) -> None:
    text = b"filler words here\n" * 20_000 + b"<<say:the end was read>>"
    user, answer = _answer(client, _send(client, "<<say:ok>>", [("big.txt", text)]))
    [document] = user.attachments
    assert document.truncated and "<<say:the end" not in (document.text or "")
    assert answer.content == "ok"
    page = client.get(f"/c/{user.conversation_id}").text
    assert "cut to fit the model&#39;s context" in page or "cut to fit the model's context" in page


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("cat.png", png(), "fake-model does not see images, so cat.png cannot be sent to it"),
        ("tool.exe", b"MZ\x90\x00\x03\x00", "tool.exe is a binary file the chat cannot read"),
        ("logo.svg", b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", "SVG files are not accepted"),
    ],
)
def test_refused_files_are_a_readable_notice_and_store_nothing(
    client: TestClient, name: str, data: bytes, message: str
) -> None:
    r = _send(client, "look", [(name, data)])
    assert r.status_code == 400
    assert r.headers["hx-retarget"] == "#notice" and message in r.text.replace("&#39;", "'")
    assert web_state(client.app).store.list_conversations() == []


def test_pictures_are_served_by_hash_with_their_type_and_nosniff(client: TestClient) -> None:
    client.get("/ui/conversations")
    store = web_state(client.app).store
    rules = AttachmentRules("m", True, 4096, 4, 1 << 20)
    [picture] = prepare([Upload("red.png", png())], store.files, rules)
    conv = store.create_conversation("pic", [NewMessage("user", "see", attachments=[picture])])
    [message] = store.get_messages(conv.id)
    name = message.attachments[0].file_name
    r = client.get(f"/ui/attachments/{name}")
    assert r.status_code == 200 and r.content == png()
    assert r.headers["content-type"] == "image/png" and r.headers["x-content-type-options"] == "nosniff"
    assert f'src="/ui/attachments/{name}"' in client.get(f"/c/{conv.id}").text
    for bad in ("..%2Fconversations.sqlite3", name.replace(".png", ".gif"), "0" * 64 + ".png", "x.svg"):
        assert client.get(f"/ui/attachments/{bad}").status_code == 404


def test_pictures_need_the_api_key_like_every_route(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path, api_key="sekret")
    with TestClient(app) as c:
        r = c.get("/ui/attachments/" + "a" * 64 + ".png", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
