"""Where OpenAI is strict, so is the API: temperature at most 2, stop strings (16, an extension over
OpenAI's 4, documented), and reasoning_effort mapped onto the reasoning models' thinking switch."""

from __future__ import annotations

from localchat.serving.schemas import ChatCompletionRequest, decode_request
from tests.helpers.fake_app import fake_client, say
from tests.helpers.live_server import REPO


def test_temperature_above_two_is_a_400_and_two_is_fine() -> None:
    with fake_client() as (client, _):
        bad = client.post("/v1/chat/completions", json={"messages": say("x"), "temperature": 2.01})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
        ok = client.post("/v1/chat/completions", json={"messages": say("x"), "temperature": 2})
        assert ok.status_code == 200


def test_up_to_sixteen_stop_strings_and_the_readme_says_so() -> None:
    with fake_client() as (client, _):
        stops = [f"s{i}" for i in range(16)]
        ok = client.post("/v1/chat/completions", json={"messages": say("x"), "stop": stops})
        assert ok.status_code == 200
        bad = client.post("/v1/chat/completions", json={"messages": say("x"), "stop": [*stops, "s16"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop"
    assert "up to 16 `stop` strings" in (REPO / "README.md").read_text()


def _kwargs(body: str) -> dict | None:
    return decode_request(body.encode(), ChatCompletionRequest).chat_template_kwargs


def test_reasoning_effort_sets_the_thinking_switch_unless_the_request_set_it() -> None:
    off = {"enable_thinking": False, "reasoning_effort": "low"}  # gpt-oss has no "off": its lowest level
    assert _kwargs('{"messages": [], "reasoning_effort": "minimal"}') == off
    assert _kwargs('{"messages": [], "reasoning_effort": "none"}') == off
    high = {"enable_thinking": True, "reasoning_effort": "high"}
    assert _kwargs('{"messages": [], "reasoning_effort": "high"}') == high
    both = '{"messages": [], "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": false}}'
    assert _kwargs(both) == {"enable_thinking": False, "reasoning_effort": "low"}
    assert _kwargs('{"messages": []}') is None
    with fake_client() as (client, _):
        bad = client.post("/v1/chat/completions", json={"messages": say("x"), "reasoning_effort": "max"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
        ok = client.post("/v1/chat/completions", json={"messages": say("x"), "reasoning_effort": "low"})
        assert ok.status_code == 200
