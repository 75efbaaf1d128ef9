"""gpt-oss's harmony output through the real server and the official openai client. The fake backend
speaks harmony here (`--tool-call-parser harmony`, its scripted reply is harmony text), so the exact
reply is known: the analysis channel arrives as `reasoning_content`, the final channel as `content`,
a `to=functions.NAME` message as `tool_calls`, streamed and not, and on the Responses API as a
reasoning item and a function_call item."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers.live_server import LiveServer, live_server

pytestmark = pytest.mark.slow

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": CITY},
}
ANSWER = (
    "<|channel|>analysis<|message|>The user greets me. Reply kindly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello there!"  # the stop token (<|return|>) ends the output
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city":"Paris"}'
)
AFTER_TOOL = (
    "<|channel|>analysis<|message|>Tool says clear.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Clear skies in Paris."
)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(["--backend", "fake", "--tool-call-parser", "harmony"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Any:  # Any: the tests pass plain dicts where the SDK types TypedDicts
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=60)


def _say(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"<<say:{text}>>"}]


def test_channels_become_reasoning_and_content(client: Any) -> None:
    reply = client.chat.completions.create(model="fake-model", messages=_say(ANSWER))
    message = reply.choices[0].message
    assert message.content == "Hello there!"
    assert (message.model_extra or {})["reasoning_content"] == "The user greets me. Reply kindly."
    assert reply.choices[0].finish_reason == "stop"


def test_streamed_channels_arrive_as_reasoning_then_content_deltas(client: Any) -> None:
    stream = client.chat.completions.create(model="fake-model", messages=_say(ANSWER), stream=True)
    kinds: list[str] = []
    reasoning = content = ""
    for chunk in stream:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if extra.get("reasoning_content"):
                reasoning += extra["reasoning_content"]
                kinds.append("reasoning")
            if choice.delta.content:
                content += choice.delta.content
                kinds.append("content")
    assert (reasoning, content) == ("The user greets me. Reply kindly.", "Hello there!")
    assert kinds.index("content") > kinds.index("reasoning") and kinds.count("reasoning") > 1  # streamed


def test_tool_call_round_trip(client: Any) -> None:
    first = client.chat.completions.create(model="fake-model", messages=_say(CALL), tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert (choice.message.model_extra or {})["reasoning_content"] == "Need the weather tool."
    second = client.chat.completions.create(
        model="fake-model",
        messages=[
            {"role": "user", "content": "weather?"},
            choice.message,
            {"role": "tool", "tool_call_id": call.id, "content": f"<<say:{AFTER_TOOL}>>"},
        ],
        tools=[WEATHER],
    )
    assert second.choices[0].message.content == "Clear skies in Paris."
    assert second.choices[0].finish_reason == "stop"


def test_streamed_tool_call_arrives_as_tool_call_deltas(client: Any) -> None:
    stream = client.chat.completions.create(
        model="fake-model",
        messages=_say(CALL),
        tools=[WEATHER],
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    pieces = 0
    for chunk in stream:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": delta.id or "", "name": "", "arguments": ""})
                entry["name"] += (delta.function and delta.function.name) or ""
                entry["arguments"] += (delta.function and delta.function.arguments) or ""
                pieces += 1
    assert [r for r in reasons if r] == ["tool_calls"]
    (call,) = calls.values()
    assert call["id"].startswith("call_") and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and pieces > 2


def test_responses_api_gets_reasoning_and_function_call_items(client: Any) -> None:
    response = client.responses.create(
        model="fake-model",
        input=f"<<say:{CALL}>>",
        tools=[{"type": "function", "name": "get_weather", "parameters": CITY}],
    )
    kinds = [item.type for item in response.output]
    assert "reasoning" in kinds and "function_call" in kinds, kinds
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    answer = client.responses.create(model="fake-model", input=f"<<say:{ANSWER}>>")
    assert answer.output_text == "Hello there!"
