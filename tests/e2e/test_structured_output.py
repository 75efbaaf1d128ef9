"""response_format, forced tool calls and logit_bias through the official openai SDK against a live
server. On the real model (SmolLM2-135M at temperature 1) every sample must parse and validate."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pydantic
import pytest

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "color": {"enum": ["red", "green", "blue"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "color", "age", "score", "tags", "address"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}


@pytest.fixture(scope="module")
def client(server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=300)


def real_only(backend: str) -> None:
    if backend == "fake":
        pytest.skip("the fake model ignores logits; the engine tests cover its masks")


@pytest.mark.parametrize("seed", [0, 100])
def test_nested_schema_samples_at_temperature_1_all_validate(client, backend, seed) -> None:  # type: ignore[no-untyped-def]
    real_only(backend)
    reply = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        temperature=1.0,
        seed=seed,
        n=10,
        max_tokens=300,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_always_parses(client, backend) -> None:  # type: ignore[no-untyped-def]
    real_only(backend)
    reply = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
        temperature=1.0,
        seed=3,
        n=8,
        max_tokens=1000,
        response_format={"type": "json_object"},
    )
    for choice in reply.choices:
        assert isinstance(json.loads(choice.message.content), dict)


def test_text_completions_take_response_format(client, backend) -> None:  # type: ignore[no-untyped-def]
    real_only(backend)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    reply = client.completions.create(
        model="",
        prompt="The answer as JSON:",
        max_tokens=50,
        temperature=1.0,
        seed=1,
        extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        },
    )
    jsonschema.validate(json.loads(reply.choices[0].text), schema)


def test_tool_choice_required_always_yields_a_call(client, backend) -> None:  # type: ignore[no-untyped-def]
    real_only(backend)
    reply = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=1.0,
        seed=5,
        n=6,
        max_tokens=200,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0].function
        name, arguments = call.name, json.loads(call.arguments)
        assert name == "get_weather"
        jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])  # type: ignore[index]


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_sdk_parse_with_a_pydantic_model(client, backend) -> None:  # type: ignore[no-untyped-def]
    real_only(backend)
    reply = client.chat.completions.parse(
        model="",
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format=Person,
        max_tokens=100,
        temperature=0,
    )
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and person.name


def test_logit_bias_bans_the_greedy_token(client, backend, model_path) -> None:  # type: ignore[no-untyped-def]
    real_only(backend)
    from localchat.weights.loader import load_model

    ask = {
        "model": "",
        "prompt": "The capital of France is",
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": 1,
    }
    first = client.completions.create(**ask)
    [token_id] = load_model(model_path).tokenizer.encode(first.choices[0].text, add_special_tokens=False)
    banned = client.completions.create(**ask, logit_bias={str(token_id): -100})
    assert banned.choices[0].text != first.choices[0].text
    # The reported logprob is still the raw model's, not the biased one.
    forced = client.completions.create(**ask, logit_bias={str(token_id): 100})
    assert forced.choices[0].logprobs.token_logprobs[0] == pytest.approx(
        first.choices[0].logprobs.token_logprobs[0], abs=1e-4
    )


def test_uncompilable_schema_is_a_400_naming_the_feature(server) -> None:  # type: ignore[no-untyped-def]
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}},
        },
    }
    with httpx.Client(base_url=server.api_url, timeout=60) as http:
        reply = http.post("/chat/completions", json=body)
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert "uniqueItems" in error["message"] and error["param"] == "response_format"
        bad_bias = http.post("/completions", json={"prompt": "x", "logit_bias": {"-4": 1}})
        assert bad_bias.status_code == 400 and bad_bias.json()["error"]["param"] == "logit_bias"
