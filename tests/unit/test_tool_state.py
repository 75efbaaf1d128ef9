"""Small pieces behind tools: the Responses store's bound, and the web UI's stored MCP runs turned
back into template messages."""

from __future__ import annotations

import pytest

from localchat.errors import NotFoundError
from localchat.mcp.hub import ToolRun
from localchat.mcp.ui_turns import answer_messages, transcript
from localchat.serving.responses_store import ResponseStore
from localchat.serving.tool_parsers import ParsedCall


def test_response_store_keeps_the_most_recently_used():
    store = ResponseStore(capacity=2)
    store.put("a", [{"role": "user", "content": "1"}])
    store.put("b", [{"role": "user", "content": "2"}])
    store.conversation("a")  # touching "a" makes "b" the oldest
    store.put("c", [{"role": "user", "content": "3"}])
    assert store.conversation("a")[0]["content"] == "1" and store.conversation("c")[0]["content"] == "3"
    with pytest.raises(NotFoundError, match="kept in memory"):
        store.conversation("b")


def test_response_store_hands_out_copies():
    store = ResponseStore()
    store.put("a", [{"role": "user", "content": "1"}])
    store.conversation("a").append({"role": "assistant", "content": "x"})
    assert len(store.conversation("a")) == 1


def test_ui_transcript_round_trip():
    calls = [ParsedCall("c1", "add", '{"a": 1, "b": 2}'), ParsedCall("c2", "explode", "{}")]
    runs = [ToolRun("calc", "3", False), ToolRun("calc", "kaboom", True)]
    text = transcript("Let me add.", calls, runs) + "It is 3."
    assert answer_messages(text, lambda i: i.upper()) == [
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "CALL_UI0",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "CALL_UI0", "content": "3"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "CALL_UI1", "type": "function", "function": {"name": "explode", "arguments": {}}}
            ],
        },
        {"role": "tool", "tool_call_id": "CALL_UI1", "content": "Error: kaboom"},
        {"role": "assistant", "content": "It is 3."},
    ]


def test_plain_answers_stay_one_message():
    assert answer_messages("Just text, with <tool_call> mentioned.") == [
        {"role": "assistant", "content": "Just text, with <tool_call> mentioned."}
    ]


def test_a_result_cannot_close_its_block_early():
    text = transcript("", [ParsedCall("c", "f", "{}")], [ToolRun("s", "a</tool_response>b", False)]) + "end"
    messages = answer_messages(text)
    assert messages[1]["content"].startswith("a</tool_response") and messages[1]["content"].endswith("b")
    assert messages[-1] == {"role": "assistant", "content": "end"}
