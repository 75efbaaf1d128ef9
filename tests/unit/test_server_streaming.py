"""SSE on the fake backend: the contract's streaming invariants, stream == non-stream, reasoning split
across deltas, logprobs, errors after the stream started, keep-alives."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.fake_app import fake_client, say
from tests.helpers.live_server import check_chat_stream, parse_sse


@pytest.fixture(scope="module")
def client():
    with fake_client() as (c, ctx):
        c.ctx = ctx  # type: ignore[attr-defined]
        yield c


def stream(client: Any, path: str = "/v1/chat/completions", **body: Any) -> tuple[bytes, Any]:
    r = client.post(path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return r.content, r


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("n", [1, 2])
def test_chat_stream_invariants(client, n, include_usage):
    raw, _ = stream(
        client, messages=say("Hello, world"), n=n, stream_options={"include_usage": include_usage}
    )
    result = check_chat_stream(parse_sse(raw), n=n, include_usage=include_usage)
    assert result["texts"] == ["Hello, world"] * n
    assert result["reasons"] == dict.fromkeys(range(n), "stop")
    if include_usage:
        plain = client.post("/v1/chat/completions", json={"messages": say("Hello, world"), "n": n}).json()
        assert result["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
        assert result["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] == n * 13
        assert "cached_tokens" in result["usage"]["prompt_tokens_details"]


def test_stream_length_finish_and_max_completion_tokens(client):
    raw, _ = stream(client, messages=say("abcdef"), max_completion_tokens=4)
    result = check_chat_stream(parse_sse(raw))
    assert result["texts"] == ["abcd"] and result["reasons"] == {0: "length"}


def test_stream_equals_non_stream_with_reasoning_split_across_deltas(client):
    text = "<think>step one, step two</think>\n\nFinal <b>answer</b>."
    raw, _ = stream(client, messages=say(text))
    events = parse_sse(raw)
    check_chat_stream(events)
    reasoning = "".join(
        c["choices"][0]["delta"].get("reasoning_content", "") for c in events[:-1] if c["choices"]
    )
    mirrored = "".join(c["choices"][0]["delta"].get("reasoning", "") for c in events[:-1] if c["choices"])
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in events[:-1] if c["choices"])
    # The fake model emits one byte per delta, so both tags arrived cut into pieces.
    assert reasoning == mirrored == "step one, step two"
    assert content == "Final <b>answer</b>."
    whole = client.post("/v1/chat/completions", json={"messages": say(text)}).json()["choices"][0]["message"]
    assert (whole["reasoning_content"], whole["content"]) == (reasoning, content)


def test_stream_logprobs_match_non_stream(client):
    raw, _ = stream(client, messages=say("abc"), logprobs=True, top_logprobs=1)
    streamed = [
        e
        for c in parse_sse(raw)[:-1]
        for ch in c["choices"]
        if ch["logprobs"]
        for e in ch["logprobs"]["content"]
    ]
    whole = client.post(
        "/v1/chat/completions", json={"messages": say("abc"), "logprobs": True, "top_logprobs": 1}
    ).json()
    assert streamed == whole["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in streamed[:3]] == ["a", "b", "c"]


def test_completions_stream(client):
    raw, _ = stream(
        client,
        "/v1/completions",
        prompt=["<<say:ab>>", "<<say:xyz>>"],
        max_tokens=10,
        stream_options={"include_usage": True},
    )
    events = parse_sse(raw)
    assert events[-1] == "[DONE]"
    texts, reasons = ["", ""], {}
    for c in events[:-2]:
        assert c["object"] == "text_completion"
        for ch in c["choices"]:
            assert ch["index"] not in reasons
            texts[ch["index"]] += ch["text"]
            if ch["finish_reason"]:
                reasons[ch["index"]] = ch["finish_reason"]
    assert texts == ["ab", "xyz"] and reasons == {0: "stop", 1: "stop"}
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 3 + 4


def test_error_after_stream_start_is_one_error_event_then_done(monkeypatch):
    with fake_client() as (c, ctx):
        runner = ctx.engine.engine.runner
        real = runner.execute_model
        calls = {"n": 0}

        def flaky(scheduler_output, batch):
            calls["n"] += 1
            if calls["n"] > 3:
                raise RuntimeError("device fell over")
            return real(scheduler_output, batch)

        monkeypatch.setattr(runner, "execute_model", flaky)
        raw, _ = stream(c, messages=say("a long answer that will not finish"))
        events = parse_sse(raw)
        assert events[-1] == "[DONE]"
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        errors = [e for e in events[:-1] if "error" in e]
        assert len(errors) == 1 and errors[0] is events[-2]
        assert "device fell over" in errors[0]["error"]["message"]
        assert set(errors[0]["error"]) == {"message", "type", "param", "code"}
        r = c.post("/v1/chat/completions", json={"messages": say("again")})
        assert r.status_code == 500 and "device fell over" in r.json()["error"]["message"]


def test_keepalive_comments_while_waiting(client, monkeypatch):
    monkeypatch.setattr("localchat.server.openai.chat.KEEPALIVE_S", 0.02)
    raw, _ = stream(client, messages=say("ab", slow_ms=150))
    assert b"\n: keep-alive\n\n" in raw or raw.startswith(b": keep-alive")
    assert check_chat_stream(parse_sse(raw))["texts"] == ["ab"]
