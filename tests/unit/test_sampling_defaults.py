"""Default sampling and the loop guard: what a request that leaves fields out samples with, and an answer
that repeats one phrase is ended (finish_reason "length", stop_reason "repetition") instead of running on."""

from __future__ import annotations

from typing import Any

import pytest

from localchat.engine.loop_guard import CHECK_EVERY, is_looping
from localchat.engine.request import FinishReason, Request
from localchat.engine.sampling_params import SamplingParams
from localchat.sampling_defaults import BUILTIN_DEFAULTS, gguf_sampling_defaults, resolve
from localchat.serving.generation import resolve_chat_max_tokens
from tests.helpers.fake_app import fake_client, say
from tests.helpers.live_server import parse_sse


def test_each_field_takes_the_request_then_the_flag_then_the_model_then_the_builtin() -> None:
    values = resolve(
        requested={"temperature": 0.3, "top_p": None},
        flags={"top_p": 0.7, "top_k": 12},
        model={"top_k": 20, "min_p": 0.1, "temperature": 0.6},
    )
    assert values == {
        "temperature": 0.3,  # request
        "top_p": 0.7,  # flag (the request's None means "not set")
        "top_k": 12,  # flag over model
        "min_p": 0.1,  # model
        "repetition_penalty": BUILTIN_DEFAULTS["repetition_penalty"],  # built-in
    }
    assert resolve({}, {}, {}) == {
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "repetition_penalty": 1.05,
    }


def test_greedy_gets_no_penalty_unless_someone_asked_for_one() -> None:
    assert "repetition_penalty" not in resolve({"temperature": 0}, {}, {})
    assert resolve({"temperature": 0}, {"repetition_penalty": 1.2}, {})["repetition_penalty"] == 1.2
    assert resolve({"temperature": 0, "repetition_penalty": 1.3}, {}, {})["repetition_penalty"] == 1.3


def test_gguf_sampling_keys_map_onto_request_fields() -> None:
    meta: dict[str, Any] = {
        "general.sampling.temp": 0.699999988079071,  # float32 as stored
        "general.sampling.top_k": 20,
        "general.sampling.top_p": 0.949999988079071,
        "general.sampling.penalty_repeat": 1.100000023841858,
        "general.sampling.min_p": "junk",  # not a number: ignored
    }
    assert gguf_sampling_defaults(meta.get) == {
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.95,
        "repetition_penalty": 1.1,
    }


def _spy(monkeypatch: pytest.MonkeyPatch, ctx: Any) -> list[SamplingParams]:
    seen: list[SamplingParams] = []
    submit = ctx.engine.submit
    monkeypatch.setattr(
        ctx.engine, "submit", lambda ids, p, sink, rid=None: (seen.append(p), submit(ids, p, sink, rid))[1]
    )
    return seen


def test_api_requests_that_omit_fields_get_the_defaults_and_clients_keep_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fake_client() as (client, ctx):
        seen = _spy(monkeypatch, ctx)
        ctx.model.generation_defaults = {"top_k": 25}
        client.post("/v1/chat/completions", json={"messages": say("x")})
        body = {"messages": say("x"), "temperature": 1.0, "top_p": 1.0}
        client.post("/v1/chat/completions", json=body)
    default, own = seen
    assert (default.temperature, default.top_k, default.top_p, default.min_p) == (0.8, 25, 0.95, 0.05)
    assert default.repetition_penalty == 1.05 and default.loop_stop == 256
    assert (own.temperature, own.top_p, own.top_k) == (1.0, 1.0, 25)


def test_chat_answers_are_capped_by_chat_max_tokens_not_the_api_limit() -> None:
    with fake_client(max_gen_tokens=4096, chat_max_tokens=300) as (_, ctx):
        assert resolve_chat_max_tokens(ctx, None) == 300
        assert resolve_chat_max_tokens(ctx, 1000) == 1000  # a conversation's own setting wins
    with fake_client() as (_, ctx):
        assert resolve_chat_max_tokens(ctx, None) == min(2048, ctx.engine.max_model_len)


@pytest.mark.parametrize(
    ("tokens", "looping"),
    [
        ([7] * 256, True),  # one glyph
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] * 30, True),  # one phrase, period 11
        (list(range(256)), False),  # no repetition
        ([1, 2] * 100 + list(range(56)), False),  # it stopped repeating
        ([*range(70)] * 4, False),  # period 70 > 256 // 4: repeated fewer than four times in the window
    ],
)
def test_is_looping(tokens: list[int], looping: bool) -> None:
    padded = [999] * (-len(tokens) % CHECK_EVERY) + tokens  # checked only on CHECK_EVERY boundaries
    assert is_looping(padded, 256) is looping
    assert not is_looping(padded, 0)


def test_a_request_that_loops_ends_as_length_with_the_reason_and_ignore_eos_disables_it() -> None:
    for ignore_eos, expected in ((False, FinishReason.LENGTH), (True, None)):
        req = Request("r", [1], SamplingParams(max_tokens=1000, loop_stop=64, ignore_eos=ignore_eos))
        reason = None
        for _ in range(64):
            req.append_output_token(5)
            reason = req.check_token_stop(max_model_len=4096)
        assert reason == expected
        assert req.stop_reason == ("repetition" if expected else None)


def test_api_answer_that_repeats_itself_stops_at_loop_stop() -> None:
    looping = "ab" * 300  # the fake model answers it byte by byte: 600 tokens of period 2
    with fake_client(loop_stop=64) as (client, _):
        body = client.post("/v1/chat/completions", json={"messages": say(looping)}).json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 64
        assert body["choices"][0]["message"]["content"] == looping[:64]
    with fake_client(loop_stop=0) as (client, _):
        body = client.post("/v1/chat/completions", json={"messages": say(looping)}).json()
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["choices"][0]["message"]["content"] == looping


def test_the_api_names_a_loop_stop_in_stop_reason_streamed_or_not() -> None:
    looping = "ab" * 300
    with fake_client(loop_stop=64) as (client, _):
        body = client.post("/v1/chat/completions", json={"messages": say(looping)}).json()
        assert body["choices"][0]["stop_reason"] == "repetition"
        plain = client.post("/v1/chat/completions", json={"messages": say("short")}).json()
        assert "stop_reason" not in plain["choices"][0]
        with client.stream(
            "POST", "/v1/chat/completions", json={"messages": say(looping), "stream": True}
        ) as r:
            events = parse_sse(r.read())
    last = [e for e in events if isinstance(e, dict) and e["choices"]][-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("length", "repetition")
