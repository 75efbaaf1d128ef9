"""Tool calls and the Responses API through real client libraries against a live server: the openai
SDK (chat tools round trip, streamed calls, `responses.create` streamed and not) and LangChain's
`ChatOpenAI.bind_tools` and `with_structured_output`. On the fake backend the scripted reply is the model's tool-call text (its
template has no tool format, so the server reads bare JSON calls); the real model answers text."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCRIPTED_CALL = '<<say:{"name": "get_weather", "arguments": {"city": "Paris"}}>>'


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture
def fake_only(backend):
    if backend != "fake":
        pytest.skip("scripted tool-call output needs the fake backend")


def test_chat_tools_round_trip(client, model, fake_only):
    question = {"role": "user", "content": SCRIPTED_CALL}
    first = client.chat.completions.create(model=model, messages=[question], tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert first.system_fingerprint and choice.message.refusal is None
    # The SDK's own message object goes back as history, with the tool's result.
    second = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": "<<say:It is sunny in Paris.>>"},
            choice.message,
            {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
        ],
        tools=[WEATHER],
    )
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"


def test_chat_tool_call_stream(client, model, fake_only):
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": SCRIPTED_CALL}],
        tools=[WEATHER],
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    for chunk in stream:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(
                    delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""}
                )
                entry["arguments"] += delta.function.arguments or ""
    assert [r for r in reasons if r] == ["tool_calls"]
    (call,) = calls.values()
    assert call["id"].startswith("call_") and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}


def test_responses_create(client, model, backend):
    text = "<<say:Hello>>" if backend == "fake" else "Say hello."
    response = client.responses.create(
        model=model, input=text, instructions="Be brief.", max_output_tokens=16
    )
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.output_text
    if backend == "fake":
        assert response.output_text == "Hello"
    follow = client.responses.create(
        model=model, input="And again?", previous_response_id=response.id, max_output_tokens=8
    )
    assert follow.previous_response_id == response.id
    assert follow.usage.input_tokens > response.usage.input_tokens


def test_responses_stream_event_order(client, model, backend):
    text = "<<say:Streaming>>" if backend == "fake" else "Name a color."
    events = list(client.responses.create(model=model, input=text, max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ] and kinds[-1] in ("response.completed", "response.incomplete")
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == events[-1].response.output_text
    if backend == "fake":
        assert streamed == "Streaming"


def test_responses_function_call(client, model, fake_only):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    response = client.responses.create(model=model, input=SCRIPTED_CALL, tools=[tool])
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    follow = client.responses.create(
        model=model,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[tool],
    )
    assert follow.status == "completed"


def test_langchain_bind_tools(server, model, fake_only):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=server.api_url, api_key="unused", model=model, max_retries=0)

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    reply = llm.bind_tools([get_weather]).invoke(SCRIPTED_CALL)
    assert reply.tool_calls == [
        {
            "name": "get_weather",
            "args": {"city": "Paris"},
            "id": reply.tool_calls[0]["id"],
            "type": "tool_call",
        }
    ]


def test_langchain_with_structured_output(server, model, backend):
    """LangChain's structured output (json_schema response_format) is enforced by constrained decoding:
    the reply parses into the Pydantic model, on the real model."""
    if backend == "fake":
        pytest.skip("the fake model ignores the mask's effect on its scripted text")
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=40)
        country: str = Field(max_length=40)
        population_millions: float = Field(ge=0, le=100)

    llm = langchain_openai.ChatOpenAI(
        base_url=server.api_url, api_key="unused", model=model, max_retries=0, temperature=0, max_tokens=400
    )
    structured = llm.with_structured_output(City, method="json_schema", strict=True)
    city = structured.invoke("Describe the capital of France.")
    assert isinstance(city, City) and 0 <= city.population_millions <= 100


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_is_a_parsed_call(client, model, backend, choice):
    """tool_choice required / named: constrained decoding writes the call in the model's own markup and
    the parser reads it back, every time (on the real model; the fake one only follows the mask)."""
    if backend == "fake":
        pytest.skip("the fake model's scripted text does not show what a forced call looks like")
    for seed in range(3):
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What's the weather like in Paris today?"}],
            tools=[WEATHER],
            tool_choice=choice,
            temperature=1.0,
            seed=seed,
            max_tokens=64,
        )
        choice_ = reply.choices[0]
        assert choice_.finish_reason == "tool_calls", choice_
        (call,) = choice_.message.tool_calls
        assert call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_responses_text_format_json_schema(client, model, backend):
    """`text.format` goes through the same constrained decoding as chat's `response_format`."""
    if backend == "fake":
        pytest.skip("the fake model's scripted text says nothing about the grammar")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=model,
        input="Invent a person.",
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        max_output_tokens=64,
        temperature=0,
    )
    person = json.loads(response.output_text)
    assert set(person) == {"name", "age"} and 0 <= person["age"] <= 120
