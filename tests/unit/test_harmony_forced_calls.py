"""Forced tool calls (`tool_choice` "required" or a named function) for gpt-oss's harmony format: the
grammar makes the model write a message addressed `to=functions.NAME` with arguments valid for that
tool, whatever it would have said instead. On the fake backend (`tool_call_parser="harmony"`), whose
scripted reply here is a plain final answer: with the grammar's mask, a scripted token the mask forbids
is replaced by the lowest allowed one, so the call can only come from the grammar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from localchat.backends.fake import FakeTokenizer
from localchat.structured.harmony_grammar import harmony_call_constraint
from localchat.structured.vocabulary import grammar_tokenizer
from tests.helpers.fake_app import fake_client, say

FINAL = say("<|channel|>final<|message|>Hello there")
NO_ARGS = {"type": "object", "properties": {}}
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "parameters": NO_ARGS}},
]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient[Any]]:
    with fake_client(tool_call_parser="harmony") as (c, _):
        yield c


def _choice(client: TestClient[Any], tool_choice: Any, **extra: Any) -> dict[str, Any]:
    body = {"messages": FINAL, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 200, **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0])


def test_auto_lets_the_model_answer_in_words(client: TestClient[Any]) -> None:
    choice = _choice(client, "auto")
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Hello there", "stop")


@pytest.mark.parametrize(("name", "arguments"), [("get_weather", {"city": "Oslo"}), ("get_time", {})])
def test_a_named_function_is_called_with_valid_arguments(
    client: TestClient[Any], name: str, arguments: dict[str, Any]
) -> None:
    choice = _choice(client, {"type": "function", "function": {"name": name}})
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == name and json.loads(call["function"]["arguments"]) == arguments
    assert (choice["message"]["content"], choice["finish_reason"]) == (None, "tool_calls")


def test_required_calls_one_of_the_tools(client: TestClient[Any]) -> None:
    choice = _choice(client, "required")
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] in {"get_weather", "get_time"}
    assert choice["finish_reason"] == "tool_calls"


def test_streamed_forced_call_arrives_as_tool_call_deltas(client: TestClient[Any]) -> None:
    body = {"messages": FINAL, "tools": TOOLS, "stream": True, "max_tokens": 200}
    body["tool_choice"] = {"type": "function", "function": {"name": "get_time"}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    deltas = [c["delta"] for chunk in lines for c in chunk["choices"]]
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_time"
    assert "".join(c["function"].get("arguments") or "" for c in calls) == "{}"
    assert not any(d.get("content") for d in deltas)


def test_markers_are_text_for_a_tokenizer_without_them() -> None:
    # The fake tokenizer spells the markers in bytes: the grammar takes them as text there. (A real
    # gpt-oss tokenizer gets them as its special tokens: tests/e2e/test_gpt_oss_forced_call.py.)
    tokenizer = FakeTokenizer()
    vocabulary = grammar_tokenizer(tokenizer, FakeTokenizer.vocab_size)
    grammar = harmony_call_constraint(vocabulary, TOOLS, "required", lambda _: False)
    matcher = grammar.new_matcher()
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    assert all(matcher.accept_token(i) for i in tokenizer.encode(call, add_special_tokens=False))
    assert matcher.is_finished or matcher.accept_token(tokenizer.eos_token_ids[0])
    wrong = grammar.new_matcher()
    bad = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}'
    assert not all(wrong.accept_token(i) for i in tokenizer.encode(bad, add_special_tokens=False))


def test_responses_forces_the_call_and_echoes_the_reasoning_effort(client: TestClient[Any]) -> None:
    tools = [{"type": "function", "name": "get_time", "parameters": NO_ARGS}]
    body = {
        "input": FINAL[0]["content"],
        "tools": tools,
        "reasoning": {"effort": "low"},
        "max_output_tokens": 200,
    }
    forced = client.post(
        "/v1/responses", json={**body, "tool_choice": {"type": "function", "name": "get_time"}}
    )
    assert forced.status_code == 200, forced.text
    calls = [i for i in forced.json()["output"] if i["type"] == "function_call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_time", "{}")]
    assert forced.json()["reasoning"] == {"effort": "low", "summary": None}
    plain = client.post("/v1/responses", json={"input": "<<say:x>>", "max_output_tokens": 5}).json()
    assert plain["reasoning"]["effort"] is None
