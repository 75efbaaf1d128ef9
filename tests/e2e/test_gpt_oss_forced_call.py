"""Forced tool calls on a tiny random gpt-oss folder (torch, float32) through the real server and the
official openai client. Left alone, its weights write `<|channel|>analysis<|message|>ok` (see
test_gpt_oss_harmony_server.py); with `tool_choice` naming a function, the grammar makes it write
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{}` with the markers as its special
tokens, so the answer is that call. The Responses API does the same and echoes `reasoning.effort`.
/v1/completions stays raw: its text keeps the markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_gpt_oss_harmony_server import write_folder
from tests.helpers.live_server import live_server

pytestmark = pytest.mark.slow

NO_ARGS = {"type": "object", "properties": {}}
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_time", "parameters": NO_ARGS}},
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
]


def test_forced_calls_on_a_gpt_oss_folder(tmp_path: Path) -> None:
    folder = tmp_path / "gpt-oss-tiny"
    write_folder(folder)
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server(args) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        hi: list[Any] = [{"role": "user", "content": "Hi"}]

        def ask(tool_choice: Any) -> Any:
            return client.chat.completions.create(
                model=model, messages=hi, tools=TOOLS, tool_choice=tool_choice, temperature=0, max_tokens=80
            ).choices[0]

        auto = ask("auto")
        assert auto.message.tool_calls is None and auto.finish_reason == "stop"
        for name, arguments in (("get_time", "{}"), ("get_weather", '{"city": "Paris"}')):
            forced = ask({"type": "function", "function": {"name": name}})
            (call,) = forced.message.tool_calls
            assert (call.function.name, call.function.arguments, forced.finish_reason) == (
                name,
                arguments,
                "tool_calls",
            )
        assert ask("required").message.tool_calls[0].function.name in {"get_time", "get_weather"}
        # The markers are the vocabulary's special tokens, one token each, not their text spelled in bytes
        # (this tokenizer has one token per byte otherwise): three markers, the header's text and "{}" (the
        # stop token is not counted). Spelled in bytes, the markers alone would be 35 tokens.
        header = "commentary to=functions.get_time json"
        usage = client.chat.completions.create(
            model=model,
            messages=hi,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            max_tokens=80,
        ).usage
        assert usage is not None and usage.completion_tokens == 3 + len(header) + len("{}")

        response = client.responses.create(
            model=model,
            input="Hi",
            tools=[{"type": "function", "name": "get_time", "parameters": NO_ARGS, "strict": False}],
            tool_choice={"type": "function", "name": "get_time"},
            reasoning={"effort": "high"},
            max_output_tokens=80,
            temperature=0,
        )
        calls = [item for item in response.output if item.type == "function_call"]
        assert [(c.name, c.arguments) for c in calls] == [("get_time", "{}")]
        assert response.reasoning is not None and response.reasoning.effort == "high"

        # Raw completions stay raw: the harmony markers are in the text, as the model wrote them.
        raw = client.completions.create(
            model=model,
            prompt="<|start|>user<|message|>Hi<|end|><|start|>assistant",
            max_tokens=12,
            temperature=0,
        )
        assert raw.choices[0].text == "<|channel|>analysis<|message|>ok<|return|>"  # the stop token too
