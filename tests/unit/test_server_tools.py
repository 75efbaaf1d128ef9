"""Tool calls through /v1/chat/completions on the fake backend (its scripted reply is the model's
text): non-streamed and streamed shapes, tool_choice, parallel_tool_calls, legacy functions, and
tool results rendered back through real chat templates. Also the small shape fixes of issue 11."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localchat.server.openai.chat_input import template_messages
from localchat.serving.schemas import ChatCompletionRequest, decode_request
from localchat.serving.tool_parsers import PARSERS
from localchat.weights.chat_template import ChatTemplate
from tests.helpers.fake_app import fake_client, say
from tests.helpers.live_server import check_chat_stream, parse_sse

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
# `<<say:…>>` ends at the first ">>", so each scripted call ends in a newline escape.
ONE_CALL = r'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
TWO_CALLS = (
    r'<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
    r'<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
)


@pytest.fixture(scope="module")
def client():
    with fake_client(tool_call_parser="hermes") as (c, _):
        yield c


def post(client: Any, path: str = "/v1/chat/completions", **body: Any) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_non_streamed_call(client):
    body = post(client, messages=say(ONE_CALL), tools=[WEATHER])
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Checking." and message["refusal"] is None
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_parallel_calls_and_null_content(client):
    message = post(client, messages=say(TWO_CALLS), tools=[WEATHER, TIME])["choices"][0]["message"]
    assert message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}


def test_parallel_tool_calls_false_keeps_one(client):
    message = post(client, messages=say(TWO_CALLS), tools=[WEATHER, TIME], parallel_tool_calls=False)[
        "choices"
    ][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]


def test_tool_choice_none_leaves_the_text_alone(client):
    choice = post(client, messages=say(ONE_CALL), tools=[WEATHER], tool_choice="none")["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert "<tool_call>" in choice["message"]["content"]


def test_without_tools_markup_is_text(client):
    choice = post(client, messages=say(ONE_CALL))["choices"][0]
    assert choice["finish_reason"] == "stop" and "<tool_call>" in choice["message"]["content"]


def test_legacy_functions_map_onto_tools(client):
    body = post(client, messages=say(ONE_CALL), functions=[WEATHER["function"]], function_call="auto")
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    r = client.post(
        "/v1/chat/completions",
        json={"messages": say("x"), "functions": [WEATHER["function"]], "tools": [TIME]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "functions"


def _stream(client: Any, **body: Any) -> list[dict[str, Any]]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = parse_sse(b"".join(r.iter_bytes()))
    check_chat_stream(events)
    return [e for e in events if isinstance(e, dict)]


@pytest.mark.parametrize("script", [ONE_CALL, TWO_CALLS])
def test_streamed_calls_follow_the_contract(client, script):
    chunks = _stream(client, messages=say(script), tools=[WEATHER, TIME])
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    call_deltas = [d for d in deltas if "tool_calls" in d]
    # Rule 5: never text and calls in one delta; a call's first delta has id, type and name.
    assert all(set(d) == {"tool_calls"} for d in call_deltas)
    seen: dict[int, dict[str, Any]] = {}
    for d in call_deltas:
        (c,) = d["tool_calls"]
        if c["index"] not in seen:
            assert c["id"].startswith("call_") and c["type"] == "function" and c["function"]["name"]
            assert c["index"] == len(seen)  # calls do not interleave
            seen[c["index"]] = {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        else:
            assert set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}
            assert c["index"] == max(seen)
            seen[c["index"]]["arguments"] += c["function"]["arguments"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    # Rule 6: the deltas add up to the non-streamed answer.
    whole = post(client, messages=say(script), tools=[WEATHER, TIME])["choices"][0]["message"]
    assert [seen[i] for i in sorted(seen)] == [c["function"] for c in whole["tool_calls"]]
    assert ("".join(d.get("content") or "" for d in deltas) or None) == whole["content"]


def test_stream_releases_text_that_only_looked_like_a_call(client):
    chunks = _stream(client, messages=say("a <tool_c or <tool_box> end"), tools=[WEATHER])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "a <tool_c or <tool_box> end"


def test_integral_floats_in_integer_fields(client):
    body = post(client, messages=say("abcdef"), max_tokens=4.0, n=1.0, seed=7.0, max_completion_tokens=3.0)
    assert body["usage"]["completion_tokens"] == 3
    r = client.post("/v1/chat/completions", json={"messages": say("x"), "max_tokens": 4.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = client.post(
        "/v1/chat/completions", json={"messages": say("x"), "logprobs": True, "top_logprobs": 2.0}
    )
    assert r.status_code == 200


def test_completions_accept_a_null_prompt(client):
    body = post(client, "/v1/completions", prompt=None, max_tokens=2)
    assert body["usage"]["prompt_tokens"] == 1 and body["system_fingerprint"].startswith("localchat-")
    r = client.post("/v1/completions", json={"max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


CONVERSATION = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0123456789abcdef",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0123456789abcdef", "content": '{"temp_c": 21}'},
    ],
    "tools": [WEATHER],
}


@pytest.mark.parametrize(
    ("template", "parser", "expected"),
    [
        (
            "qwen2_5.jinja",
            "hermes",
            [
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
                '<tool_response>\n{"temp_c": 21}\n</tool_response>',
            ],
        ),
        (
            "llama3_1.jinja",
            "llama3",
            [
                '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                'ipython<|end_header_id|>\n\n"{\\"temp_c\\": 21}"',  # HF's template JSON-quotes string results
            ],
        ),
        (
            "mistral_v0_3.jinja",
            "mistral",
            [
                '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "',
                '[TOOL_RESULTS] {"content": {"temp_c": 21}, "call_id": "',
            ],
        ),
    ],
)
def test_tool_results_render_back_through_real_templates(template, parser, expected):
    req = decode_request(json.dumps(CONVERSATION).encode(), ChatCompletionRequest)
    messages = template_messages(req, PARSERS[parser]().template_call_id)
    text = ChatTemplate((TEMPLATES / template).read_text(), bos_token="<s>", eos_token="</s>").render(
        messages, tools=[WEATHER]
    )
    for piece in expected:
        assert piece in text
    if parser == "mistral":  # its template insists on 9-character ids, the same for call and result
        short = PARSERS["mistral"]().template_call_id("call_0123456789abcdef")
        assert text.count(f'"{short}"') == 2
