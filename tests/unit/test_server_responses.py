"""POST /v1/responses on the fake backend: output items, the streamed event sequence, function
calls and their outputs, text.format, previous_response_id, and the errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.fake_app import fake_client

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = r'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>\n'


@pytest.fixture(scope="module")
def client():
    with fake_client(tool_call_parser="hermes") as (c, ctx):
        c.ctx = ctx  # type: ignore[attr-defined]
        yield c


def create(client: Any, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def events(client: Any, **body: Any) -> list[dict[str, Any]]:
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_bytes()).decode()
    out = []
    for block in raw.strip().split("\n\n"):
        lines = block.split("\n")
        if lines == ["data: [DONE]"]:
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        event = json.loads(lines[1][len("data: ") :])
        assert event["type"] == lines[0][len("event: ") :]
        out.append(event)
    return out


def test_text_response(client):
    body = create(client, input="<<say:Hello there>>", instructions="Be brief.", max_output_tokens=50)
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "completed"
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [
        {"type": "output_text", "text": "Hello there", "annotations": [], "logprobs": []}
    ]
    usage = body["usage"]
    assert usage["output_tokens"] == len("Hello there") + 1
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_max_output_tokens_makes_it_incomplete(client):
    body = create(client, input="<<say:a long answer>>", max_output_tokens=3)
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_stream_event_sequence(client):
    evs = events(client, input="<<say:Hi!>>")
    kinds = [e["type"] for e in evs]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert evs[-1]["response"]["output"][0]["content"][0]["text"] == "Hi!"
    assert "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta") == "Hi!"


def test_function_call_streamed_and_not(client):
    body = create(client, input=f"<<say:{CALL}>>", tools=[WEATHER])
    message, call = body["output"]
    assert message["content"][0]["text"] == "Let me look."
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert call["call_id"].startswith("call_") and json.loads(call["arguments"]) == {"city": "Rome"}
    evs = events(client, input=f"<<say:{CALL}>>", tools=[WEATHER])
    kinds = [e["type"] for e in evs]
    start = kinds.index("response.output_item.added", kinds.index("response.output_item.done"))
    assert evs[start]["item"]["type"] == "function_call" and evs[start]["item"]["name"] == "get_weather"
    tail = [k for k in kinds[start + 1 :] if k != "response.function_call_arguments.delta"]
    assert tail == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    pieces = "".join(e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta")
    assert pieces == call["arguments"]


def test_function_call_output_and_previous_response_id(client):
    first = create(client, input="<<say:noted>>", instructions="Remember.")
    prompt = client.ctx.encode_chat
    second = create(
        client,
        previous_response_id=first["id"],
        input=[
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Rome"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
    )
    # The fake model repeats the first <<say:…>> it finds: the earlier turn is in the prompt.
    assert second["output"][0]["content"][0]["text"] == "noted"
    history = [
        {"role": "user", "content": "<<say:noted>>"},
        {"role": "assistant", "content": "noted"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert second["usage"]["input_tokens"] == len(prompt(history))  # instructions are not carried over


def test_text_format_is_checked(client):
    body = create(client, input="<<say:{}>>", text={"format": {"type": "json_object"}})
    assert body["text"] == {"format": {"type": "json_object"}}
    r = client.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "yaml"}}})
    assert r.status_code == 400


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
        ({"input": []}, 400, "input"),
        ({"input": [{"role": "wizard", "content": "x"}]}, 400, "input[0].role"),
        ({"input": [{"type": "image", "url": "x"}]}, 400, "input[0].type"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({}, 400, "input"),
    ],
)
def test_bad_requests(client, body, status, param):
    r = client.post("/v1/responses", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_route_without_v1(client):
    assert (
        client.post("/responses", json={"input": "<<say:ok>>"}).json()["output"][0]["content"][0]["text"]
        == "ok"
    )
