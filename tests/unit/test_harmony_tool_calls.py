"""gpt-oss's harmony output through the chat path's shared ChoiceDeltas: the analysis channel becomes
`reasoning_content`, final/commentary `content`, a `to=functions.NAME` message a tool call; every cut
of the text into deltas (each single cut, and one character at a time) folds into the same message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localchat.server.openai.chat_output import ChoiceDeltas, message_of
from localchat.server.openai.chat_tools import ToolPlan
from localchat.serving.tool_parsers import HarmonyParser, pick_parser

# Recorded shapes of gpt-oss replies (the text after the prompt's `<|start|>assistant`).
CALL = (
    "<|channel|>analysis<|message|>Need weather for Paris. Use the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city":"Paris","unit":"c"}<|call|>'
)
CALL_RECIPIENT_FIRST = (
    "<|channel|>analysis<|message|>Two lookups.<|end|>"
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Rome"}<|call|>'
)
TWO_CALLS = (
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city":"Oslo"}<|call|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>'
    'json<|message|>{"zone":"CET"}<|call|>'
)
ANSWER = (
    "<|channel|>analysis<|message|>The tool said 21C. Answer briefly.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checked. <|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 21 °C in Paris <|>.<|return|><|endoftext|>"
)
BUILTIN = (
    '<|channel|>analysis to=browser.search code<|message|>{"query":"x"}<|call|>'
    "<|start|>assistant<|channel|>final<|message|>done"
)
TOOLS = {"get_weather", "get_time"}


def _plan(names: set[str] = TOOLS, max_calls: int | None = None) -> ToolPlan:
    return ToolPlan([{}] if names else None, HarmonyParser(), "auto", set(names), max_calls)


def _message(pieces: list[str], plan: ToolPlan) -> dict[str, Any]:
    deltas = ChoiceDeltas(False, plan.new_stream())
    out: list[dict[str, Any]] = []
    for p in pieces:
        out += deltas.push(p)
    out += deltas.flush()
    for d in out:  # a delta never mixes reasoning, text and call markup, and never leaks markers
        assert len({"content", "tool_calls", "reasoning_content"} & d.keys()) == 1, d
        assert "<|channel|>" not in json.dumps(d) and "<|message|>" not in json.dumps(d)
    message = message_of(out)
    for call in message.get("tool_calls", []):
        call["id"] = "ID"  # fresh per call
    message["num_calls"] = deltas.num_calls
    return message


def _calls(*calls: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"id": "ID", "type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]


CASES = [
    (
        CALL,
        "Need weather for Paris. Use the tool.",
        None,
        _calls(("get_weather", '{"city":"Paris","unit":"c"}')),
    ),
    (CALL_RECIPIENT_FIRST, "Two lookups.", None, _calls(("get_weather", '{"city":"Rome"}'))),
    (TWO_CALLS, "", None, _calls(("get_weather", '{"city":"Oslo"}'), ("get_time", '{"zone":"CET"}'))),
    (ANSWER, "The tool said 21C. Answer briefly.", "Checked. It is 21 °C in Paris <|>.", []),
    (BUILTIN, '{"query":"x"}', "done", []),
]


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), CASES)
def test_every_cut_gives_the_same_message(
    text: str, reasoning: str, content: str | None, calls: list[dict[str, Any]]
) -> None:
    whole = _message([text], _plan())
    assert whole.get("reasoning_content", "") == reasoning
    assert whole["content"] == content
    assert whole.get("tool_calls", []) == calls
    assert whole["num_calls"] == len(calls)
    for at in range(1, len(text)):
        assert _message([text[:at], text[at:]], _plan()) == whole, at
    assert _message(list(text), _plan()) == whole


def test_calls_stream_as_tool_call_deltas_name_first_then_arguments() -> None:
    deltas = ChoiceDeltas(False, _plan().new_stream())
    out = [d for ch in CALL for d in deltas.push(ch)] + deltas.flush()
    calls = [d["tool_calls"][0] for d in out if "tool_calls" in d]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"]
    assert all("id" not in c and c["index"] == 0 for c in calls[1:])
    assert len(calls) > 5  # the arguments arrive piece by piece, not at the end
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city":"Paris","unit":"c"}'
    reasoning = [d for d in out if "reasoning_content" in d]
    assert reasoning[0]["reasoning_content"] == "N"  # reasoning streams as it comes


def test_parallel_tool_calls_false_keeps_the_first_call_only() -> None:
    message = _message([TWO_CALLS], _plan(max_calls=1))
    assert message["tool_calls"] == _calls(("get_weather", '{"city":"Oslo"}'))
    assert message["content"] is None


def test_without_tools_the_channels_still_split_and_a_call_body_is_text() -> None:
    message = _message([CALL], _plan(set()))
    assert message["reasoning_content"] == "Need weather for Paris. Use the tool."
    assert message["content"] == '{"city":"Paris","unit":"c"}'
    assert "tool_calls" not in message


def test_harmony_is_picked_from_a_template_that_writes_channels() -> None:
    template = "{{ '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"
    parser = pick_parser("auto", template)
    assert isinstance(parser, HarmonyParser)
    assert parser.keeps_special_tokens and not parser.can_force
    assert not pick_parser("auto", "<tool_call>").keeps_special_tokens
