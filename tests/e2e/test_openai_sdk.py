"""The official `openai` SDK (sync, async, streaming) and raw httpx SSE against a live `localchat serve`."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.helpers.live_server import check_chat_stream, parse_sse
from tests.helpers.run_async import run_async

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colors of the rainbow."}]
GREEDY = {"temperature": 0, "max_tokens": 24}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def greedy(client, model_id):
    return client.chat.completions.create(model=model_id, messages=QUESTION, logprobs=True, **GREEDY)


def test_models(client, model_id, server):
    models = client.models.list().data
    assert len(models) == 1 and models[0].object == "model" and models[0].owned_by == "localchat"
    assert client.models.retrieve(model_id).id == model_id
    with httpx.Client(base_url=server.base_url) as raw:
        assert raw.get("/v1/models").json()["data"][0]["max_model_len"] > 0


def test_chat_exact_usage(greedy, prompt_tokens):
    assert greedy.object == "chat.completion" and greedy.id.startswith("chatcmpl-")
    choice = greedy.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = greedy.usage
    assert usage.prompt_tokens == prompt_tokens(QUESTION)
    assert usage.completion_tokens == len(choice.logprobs.content)  # one logprob per generated token
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_streaming_equals_non_streaming(client, model_id, greedy):
    stream = client.chat.completions.create(
        model=model_id, messages=QUESTION, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == greedy.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == greedy.usage.prompt_tokens


def test_async_client_concurrent(server, model_id, greedy):
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=server.api_url, api_key="x", max_retries=0, timeout=120
        ) as aclient:

            async def one() -> str:
                r = await aclient.chat.completions.create(model=model_id, messages=QUESTION, **GREEDY)
                return r.choices[0].message.content

            async def streamed() -> str:
                s = await aclient.chat.completions.create(
                    model=model_id, messages=QUESTION, stream=True, **GREEDY
                )
                return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])

            return await asyncio.gather(one(), one(), streamed(), streamed())

    assert run_async(run()) == [greedy.choices[0].message.content] * 4


def test_completions(client, model_id):
    r = client.completions.create(
        model=model_id, prompt="The sky is", max_tokens=6, temperature=0, logprobs=2
    )
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    choice = r.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert len(choice.logprobs.tokens) == r.usage.completion_tokens <= 6
    streamed = client.completions.create(
        model=model_id, prompt="The sky is", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text


def test_seeded_sampling_is_reproducible_and_n2_uses_seed_plus_index(client, model_id):
    args = {"model": model_id, "messages": QUESTION, "temperature": 1.0, "max_tokens": 16}
    a = client.chat.completions.create(seed=1234, **args).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **args).choices[0].message.content
    assert a == b
    pair = client.chat.completions.create(seed=1234, n=2, **args)
    assert [c.index for c in pair.choices] == [0, 1]
    assert pair.choices[0].message.content == a
    assert (
        pair.choices[1].message.content
        == client.chat.completions.create(seed=1235, **args).choices[0].message.content
    )


def test_logprobs_and_top_logprobs(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=QUESTION, logprobs=True, top_logprobs=3, **GREEDY
    )
    for entry in r.choices[0].logprobs.content:
        assert 1 <= len(entry.top_logprobs) <= 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and entry.logprob <= 0
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely token
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token or "\ufffd" in entry.token


def test_stop_string(client, model_id, greedy):
    text = greedy.choices[0].message.content
    cut = len(text) // 2
    stop = text[cut : cut + 3]
    assert stop.strip(), text
    r = client.chat.completions.create(model=model_id, messages=QUESTION, stop=[stop], **GREEDY)
    assert r.choices[0].message.content == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    single = httpx.post(
        f"{client.base_url}chat/completions",
        json={"model": model_id, "messages": QUESTION, "stop": {"Single": stop}, **GREEDY},
        timeout=120,
    ).json()
    assert single["choices"][0]["message"]["content"] == text[: text.index(stop)]


def test_cached_tokens_on_a_repeated_prompt(client, model_id):
    messages = [{"role": "system", "content": "You answer briefly. " * 20}, *QUESTION]
    client.chat.completions.create(model=model_id, messages=messages, temperature=0, max_tokens=2)
    again = client.chat.completions.create(
        model=model_id, messages=messages, temperature=0, max_tokens=2
    ).usage
    # All but the last token: whole blocks, then the first tokens of the last one copied (partial reuse;
    # a 2-token reply leaves that block partly filled, and the engine keeps it as a source all the same).
    assert again.prompt_tokens_details.cached_tokens == again.prompt_tokens - 1


@pytest.mark.parametrize(("n", "include_usage"), [(1, False), (1, True), (2, True)])
def test_raw_sse_invariants(server, model_id, n, include_usage, greedy):
    body = {
        "model": model_id,
        "messages": QUESTION,
        "stream": True,
        "n": n,
        "stream_options": {"include_usage": include_usage},
        **GREEDY,
    }
    with (
        httpx.Client(timeout=120) as raw,
        raw.stream("POST", server.api_url + "/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        data = r.read()
    result = check_chat_stream(parse_sse(data), n=n, include_usage=include_usage)
    assert result["texts"] == [greedy.choices[0].message.content] * n
    if include_usage:
        assert result["usage"]["completion_tokens"] == n * greedy.usage.completion_tokens


def test_dify_ping_and_stream_lines(server, model_id):
    """Dify's provider: a non-streaming ping when the model is added; every stream line JSON or a comment."""
    with httpx.Client(timeout=120) as raw:
        ping = raw.post(
            server.api_url + "/chat/completions",
            json={
                "model": model_id,
                "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 5,
                "stream": False,
            },
        )
        assert ping.status_code == 200 and ping.json()["object"] == "chat.completion"
        body = {
            "model": model_id,
            "messages": QUESTION,
            "stream": True,
            "max_tokens": 12,
            "stream_options": {"include_usage": True},
            "temperature": 0.2,
            "user": "dify-user",
        }
        with raw.stream("POST", server.api_url + "/chat/completions", json=body) as r:
            lines = [line for line in r.iter_lines() if line.strip()]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        if line.startswith(":"):
            continue
        assert line.startswith("data: "), line
        json.loads(line[len("data: ") :])
    assert json.loads(lines[-2][6:])["usage"]["total_tokens"] > 0
