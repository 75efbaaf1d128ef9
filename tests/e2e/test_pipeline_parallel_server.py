"""`localchat serve --pp 2` on CPU (gloo, a spawned worker holding the second stage) answers the
official openai client exactly like one process, plain and streamed."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.helpers.live_server import live_server, server_args
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.slow


def _answers(args: list[str]) -> tuple[str, str, str]:
    """(a chat answer, the same streamed, the server's device line) through the openai client."""
    with live_server(args) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "Say something about pipelines."}
        ]
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True
        )
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        log = server.log()
    assert server.proc.returncode == 0, server.log()[-2000:]  # the worker did not block the shutdown
    return str(reply.choices[0].message.content), streamed, log


def test_pp2_server_answers_like_one_process(tmp_path: Path) -> None:
    cfg = tiny_config(num_hidden_layers=3)
    model = write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=3), cfg, qtype="F32")
    args = [*server_args("torch", model), "--device", "cpu", "--threads", "1"]
    single, single_streamed, _ = _answers(args)
    assert single and single_streamed == single
    answer, streamed, _ = _answers([*args, "--pp", "2"])
    assert (answer, streamed) == (single, single)
