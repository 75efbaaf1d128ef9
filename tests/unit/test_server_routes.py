"""OpenAI routes on the fake backend: response shapes, usage, n, seeds, stop, logprobs, tools, models."""

from __future__ import annotations

from typing import Any

import pytest

from localchat import __version__
from localchat.backends.fake import DEFAULT_REPLY
from tests.helpers.fake_app import fake_client, say


@pytest.fixture(scope="module")
def client():
    with fake_client() as (c, ctx):
        c.ctx = ctx  # type: ignore[attr-defined]
        yield c


def chat(client: Any, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_completion_shape_and_exact_usage(client):
    body = chat(client, model="fake-model", messages=say("Hi there"))
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "fake-model" and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice == {
        "index": 0,
        "message": {"role": "assistant", "content": "Hi there", "refusal": None},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert body["system_fingerprint"] == f"localchat-{__version__}-fake"
    prompt = client.ctx.encode_chat([{"role": "user", "content": "<<say:Hi there>>"}])
    usage = body["usage"]
    # The fake tokenizer is one token per byte; the EOS that ended the reply counts as generated.
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == len("Hi there") + 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (
        usage["prompt_tokens_details"] == {"cached_tokens": 0}
        or usage["prompt_tokens_details"]["cached_tokens"] >= 0
    )


def test_cached_tokens_count_prefix_cache_hits(client):
    messages = say("cache me " + "x" * 100)
    chat(client, messages=messages)
    again = chat(client, messages=messages)["usage"]
    # Every prompt token but the last comes from the cache: whole blocks, then the last block's first
    # tokens copied (partial reuse, engine/block_manager.py).
    assert again["prompt_tokens_details"]["cached_tokens"] == again["prompt_tokens"] - 1


def test_routes_answer_without_v1_prefix(client):
    assert (
        client.post("/chat/completions", json={"messages": say("ok")}).json()["choices"][0]["message"][
            "content"
        ]
        == "ok"
    )
    assert client.post("/completions", json={"prompt": "<<say:ok>>"}).json()["choices"][0]["text"] == "ok"
    assert client.get("/models").json()["data"][0]["id"] == "fake-model"


def test_default_reply_and_missing_model_field(client):
    assert (
        chat(client, messages=[{"role": "user", "content": "hello"}])["choices"][0]["message"]["content"]
        == DEFAULT_REPLY
    )


def test_max_tokens_and_max_completion_tokens_give_length(client):
    for key in ("max_tokens", "max_completion_tokens"):
        body = chat(client, messages=say("abcdefgh"), **{key: 3})
        assert body["choices"][0]["message"]["content"] == "abc"
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("stop", ["cd", ["zz", "cd"], {"Single": "cd"}, {"Multiple": ["cd"]}])
def test_stop_forms(client, stop):
    body = chat(client, messages=say("abcdefgh"), stop=stop)
    assert body["choices"][0]["message"]["content"] == "ab"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_n_choices_and_seed_offsets(client):
    body = chat(client, messages=say("same"), n=3, seed=7)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == "same" for c in body["choices"])
    prompt = body["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == 3 * (len("same") + 1)
    assert prompt == len(client.ctx.encode_chat(say("same")))  # the prompt is counted once


def test_seed_maps_to_choice_offsets(client, monkeypatch):
    seen: list[int | None] = []
    submit = client.ctx.engine.submit

    def spy(ids, params, sink, req_id=None):
        seen.append(params.seed)
        return submit(ids, params, sink, req_id)

    monkeypatch.setattr(client.ctx.engine, "submit", spy)
    chat(client, messages=say("x"), n=3, seed=41)
    assert seen == [41, 42, 43]
    seen.clear()
    chat(client, messages=say("x"), n=2)
    assert seen == [None, None]


def test_sampling_defaults_from_settings_and_request_wins(monkeypatch):
    with fake_client(temperature=0.25, top_k=5) as (c, ctx):
        seen = []
        submit = ctx.engine.submit
        monkeypatch.setattr(
            ctx.engine,
            "submit",
            lambda ids, p, sink, rid=None: (seen.append(p), submit(ids, p, sink, rid))[1],
        )
        c.post("/v1/chat/completions", json={"messages": say("x")})
        c.post("/v1/chat/completions", json={"messages": say("x"), "temperature": 0.9, "max_tokens": 7})
    assert (seen[0].temperature, seen[0].top_k, seen[0].max_tokens) == (0.25, 5, ctx.settings.max_gen_tokens)
    assert (seen[1].temperature, seen[1].top_k, seen[1].max_tokens) == (0.9, 5, 7)


def test_chat_logprobs_openai_format(client):
    body = chat(client, messages=say("hé"), logprobs=True, top_logprobs=2)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]  # one entry per generated token
    first = content[0]
    assert first["token"] == "h" and first["bytes"] == [104] and first["logprob"] == -0.5
    assert [t["logprob"] for t in first["top_logprobs"]] == [-0.5, -1.5]
    # "é" is two byte-tokens: each carries its raw byte, which together decode to the character.
    assert content[1]["bytes"] + content[2]["bytes"] == list("é".encode())
    assert (
        chat(client, messages=say("a"), logprobs=True)["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        == []
    )


def test_completions_text_logprobs_echo_and_multiple_prompts(client):
    r = client.post("/v1/completions", json={"prompt": "<<say:xyz>>", "max_tokens": 2, "logprobs": 1}).json()
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-")
    (choice,) = r["choices"]
    assert choice["text"] == "xy" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["x", "y"] and choice["logprobs"]["text_offset"] == [0, 1]
    assert choice["logprobs"]["top_logprobs"] == [{"x": -0.5}, {"y": -0.5}]
    echoed = client.post("/v1/completions", json={"prompt": "<<say:ab>>", "echo": True}).json()
    assert echoed["choices"][0]["text"] == "<<say:ab>>ab"
    many = client.post("/v1/completions", json={"prompt": ["<<say:a>>", "<<say:bb>>"], "n": 2}).json()
    assert [c["text"] for c in many["choices"]] == ["a", "a", "bb", "bb"]
    assert many["usage"]["prompt_tokens"] == len("<<say:a>>") + len("<<say:bb>>")
    ids = client.ctx.model.tokenizer.encode("<<say:tok>>")
    assert client.post("/v1/completions", json={"prompt": ids}).json()["choices"][0]["text"] == "tok"


def test_reasoning_split_non_streaming(client):
    body = chat(client, messages=say("<think>Let me think.</think>\n\nThe answer."))
    message = body["choices"][0]["message"]
    assert message["content"] == "The answer."
    assert message["reasoning_content"] == message["reasoning"] == "Let me think."


def test_tools_are_rendered_into_the_template(client, monkeypatch):
    from localchat.weights.chat_template import ChatTemplate

    template = ChatTemplate(
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    )
    monkeypatch.setattr(client.ctx, "template", template)
    prompts: list[str] = []
    submit = client.ctx.engine.submit
    tok = client.ctx.model.tokenizer
    monkeypatch.setattr(
        client.ctx.engine,
        "submit",
        lambda ids, p, sink, rid=None: (prompts.append(tok.decode(ids)), submit(ids, p, sink, rid))[1],
    )
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    chat(client, messages=say("ok"), tools=tools)
    chat(client, messages=say("ok"), tools=tools, tool_choice="none")
    assert prompts[0].startswith("TOOLS:get_weather;")
    assert "TOOLS" not in prompts[1]


def test_assistant_tool_calls_and_content_parts_accepted(client):
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "<<say:ok>>"},
    ]
    assert (
        chat(client, messages=messages, user="u1", vendor_extra={"x": 1})["choices"][0]["message"]["content"]
        == "ok"
    )


def test_models_and_model_by_id(client):
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["object"] == "model" and card["owned_by"] == "localchat"
    assert card["max_model_len"] == client.ctx.engine.max_model_len
    assert client.get("/v1/models/fake-model").json()["id"] == "fake-model"
    assert client.get("/v1/models/nope").status_code == 404


def test_health_and_metrics(client):
    assert client.get("/health").json()["status"] == "ok"
    chat(client, messages=say("count me"))
    text = client.get("/metrics").text
    assert text.endswith("\n")
    values = {k: float(v) for k, v in (ln.split() for ln in text.splitlines() if not ln.startswith("#"))}
    for name in (
        "localchat_requests_running",
        "localchat_requests_waiting",
        "localchat_kv_blocks_used",
        "localchat_kv_blocks_total",
        "localchat_kv_blocks_touched",
        "localchat_prefix_cache_hit_rate",
        "localchat_generation_tokens_per_second",
        "localchat_generation_tokens_total",
        "localchat_requests_finished_total",
    ):
        assert name in values
    assert values["localchat_kv_blocks_used"] == 0 and values["localchat_kv_blocks_total"] > 0
    assert 0 < values["localchat_kv_blocks_touched"] < values["localchat_kv_blocks_total"]
    assert values["localchat_generation_tokens_total"] >= len("count me") + 1
    assert "# TYPE localchat_generation_tokens_total counter" in text


def test_web_ui_is_mounted_unless_no_ui():
    import importlib.util

    from localchat.server.app import create_app
    from localchat.serving.assembly import build_context
    from tests.helpers.fake_app import fake_settings

    def paths(ui: bool) -> set[str]:
        settings = fake_settings(ui=ui)
        return {route.path for route in create_app(settings, build_context(settings)).routes}

    api_only = paths(False)
    assert {"/v1/chat/completions", "/chat/completions", "/health", "/metrics"} <= api_only
    if importlib.util.find_spec("localchat.server.web") is None:
        pytest.skip("the web UI module is not there yet")
    assert paths(True) > api_only


def test_metrics_has_latency_histograms_in_prometheus_form(client):
    before = client.get("/metrics").text
    body = chat(client, messages=say("four"))
    text = client.get("/metrics").text

    def series(page: str, name: str) -> dict[str, float]:
        return {
            ln.split()[0][len(name) :]: float(ln.split()[1])
            for ln in page.splitlines()
            if ln.startswith(name + "_")
        }

    for name in ("localchat_time_to_first_token_seconds", "localchat_inter_token_latency_seconds"):
        assert f"# TYPE {name} histogram" in text
        old, new = series(before, name), series(text, name)
        buckets = [v for k, v in new.items() if k.startswith("_bucket")]
        assert buckets == sorted(buckets) and '_bucket{le="+Inf"}' in new  # cumulative, ending at +Inf
        assert new['_bucket{le="+Inf"}'] == new["_count"] and new["_sum"] >= old["_sum"]
    ttft = series(text, "localchat_time_to_first_token_seconds")["_count"]
    itl = series(text, "localchat_inter_token_latency_seconds")["_count"]
    old_ttft = series(before, "localchat_time_to_first_token_seconds")["_count"]
    old_itl = series(before, "localchat_inter_token_latency_seconds")["_count"]
    assert ttft - old_ttft == 1
    assert itl - old_itl == body["usage"]["completion_tokens"] - 1
