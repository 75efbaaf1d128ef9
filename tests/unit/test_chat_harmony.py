"""gpt-oss's harmony output in the web UI's conversations (ChatService): the analysis channel is stored
and streamed as the `<think>` block the UI shows as "Thinking", the final channel as the answer, and no
harmony marker reaches the page, the stream or the store. The fake backend speaks harmony here
(`tool_call_parser="harmony"`): its scripted reply is harmony text, decoded with its special tokens."""

from __future__ import annotations

import html
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from localchat.chats.history import chat_messages
from localchat.chats.records import DONE
from tests.ui.web_app import fake_app, web_state

HX = {"HX-Request": "true"}
REASONING = "The user greets me. Reply kindly."
ANSWER = (
    f"<|channel|>analysis<|message|>{REASONING}<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello **there**!"
)
STORED = f"<think>{REASONING}</think>Hello **there**!"
MARKERS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "analysis", "final")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Any]]:
    app, _ = fake_app(tmp_path, tool_call_parser="harmony")
    with TestClient(app) as c:
        c.get("/ui/conversations")  # the UI opens its store on its first request
        yield c


def _new_chat(client: TestClient[Any], content: str) -> str:
    r = client.post("/ui/chats", data={"content": content}, headers=HX)
    assert r.status_code == 200, r.text
    return str(r.headers["hx-redirect"].rsplit("/", 1)[1])


def _wait_done(client: TestClient[Any], conv_id: str) -> Any:
    chats = web_state(client.app).chats
    deadline = time.monotonic() + 10
    while chats.is_generating(conv_id):
        assert time.monotonic() < deadline, "the answer did not finish"
        time.sleep(0.02)
    return web_state(client.app).store.get_messages(conv_id)


def _events(client: TestClient[Any], message_id: int) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    with client.stream("GET", f"/ui/m/{message_id}/stream") as r:
        event, data = "", []
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and event:
                events.append((event, "\n".join(data)))
                event, data = "", []
                if events[-1][0] == "done":
                    break
    return events


def test_harmony_answer_is_stored_as_thinking_and_answer(client: TestClient[Any]) -> None:
    conv_id = _new_chat(client, f"<<say:{ANSWER}>>")
    user, answer = _wait_done(client, conv_id)
    assert (answer.status, answer.content) == (DONE, STORED)
    page = client.get(f"/c/{conv_id}").text
    shown = page[page.index(f'id="m-{answer.id}"') :]  # the answer's article (the question has markers)
    assert "&lt;think&gt;The user greets me. Reply kindly.&lt;/think&gt;Hello **there**!" in shown
    assert "|&gt;" not in shown and "|>" not in shown
    # The next prompt carries the answer only, as for a `<think>` model: reasoning is not sent back.
    conv = web_state(client.app).store.get_conversation(conv_id)
    history = chat_messages(conv, [user, answer])
    assert history[-1] == {"role": "assistant", "content": "Hello **there**!"}


def test_streamed_deltas_are_the_think_form_cut_anywhere(client: TestClient[Any]) -> None:
    # One character per engine step: markers arrive cut across deltas and must still never leak.
    conv_id = _new_chat(client, f"<<slow:5>><<say:{ANSWER}>>")
    answer = web_state(client.app).store.get_messages(conv_id)[1]
    events = _events(client, answer.id)
    deltas = [html.unescape(d) for k, d in events if k in ("snapshot", "delta")]  # sent as HTML text
    assert "".join(deltas) == STORED
    assert len([d for d in deltas if d]) > 3  # it streamed
    for delta in deltas:
        assert not any(m in delta for m in MARKERS[:4]) and "<|" not in delta and "|>" not in delta, delta
    # The thinking block opens with the first delta, before any of the answer.
    assert next(d for d in deltas if d).startswith("<think>")


def test_a_cut_off_answer_still_closes_its_thinking_block(client: TestClient[Any]) -> None:
    conv_id = _new_chat(client, f"<<say:<|channel|>analysis<|message|>{REASONING}>>")
    answer = _wait_done(client, conv_id)[1]
    assert answer.content == f"<think>{REASONING}</think>"


def test_harmony_answers_are_decoded_with_their_special_tokens(tmp_path: Path) -> None:
    for parser, skips in (("harmony", False), ("hermes", True)):
        app, ctx = fake_app(tmp_path / parser, tool_call_parser=parser)
        with TestClient(app) as c:
            c.get("/ui/conversations")
            chats = web_state(c.app).chats
            conv = web_state(c.app).store.create_conversation("t")
            assert chats.sampling_params(conv, ctx).skip_special_tokens is skips


def test_a_harmony_call_to_an_mcp_tool_runs_and_the_answer_goes_on(tmp_path: Path) -> None:
    calc = Path(__file__).resolve().parents[1] / "helpers" / "mcp_calc_server.py"
    config = tmp_path / "mcp.json"
    servers = {"calc": {"command": sys.executable, "args": [str(calc)], "autoUse": True}}
    config.write_text(json.dumps({"mcpServers": servers}))
    call = (
        "<|channel|>analysis<|message|>Add them.<|end|>"
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 2, "b": 3}'
    )
    app, _ = fake_app(tmp_path / "home", tool_call_parser="harmony", mcp_config=str(config))
    with TestClient(app) as client:
        client.get("/ui/conversations")
        web_state(client.app).chats.consent.allow("calc", "add")  # no Allow / Deny to press here
        conv_id = _new_chat(client, f"<<say:{call}>>")
        answer = _wait_done(client, conv_id)[1]
    # The call left the text; its canonical block and result follow the thinking; the tool's result
    # (the calc server answers with a fake-model script) makes the next turn's answer.
    assert answer.status == DONE
    assert answer.content.startswith("<think>Add them.</think>\n\n<tool_call>\n"), answer.content
    assert '{"name": "add", "arguments": {"a": 2, "b": 3}}' in answer.content
    assert answer.content.endswith("</tool_response>\n\nThe sum is 5.")
    assert "<|" not in answer.content
