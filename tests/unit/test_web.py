"""The web UI's server side, without a browser: pages, htmx partials, the answer stream, persistence."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from localchat.chats.records import DONE, ERROR, STOPPED
from localchat.serving import chat_render
from tests.helpers.deadline import wait_until
from tests.ui.web_app import fake_app, web_state

HX = {"HX-Request": "true"}
XSS_TITLE = '<script>alert("t")</script> & "quotes"'


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app, _ = fake_app(tmp_path)
    with TestClient(app) as c:
        yield c


def _store(client: TestClient) -> Any:
    if web_state(client.app) is None:
        client.get("/ui/conversations")  # the UI opens its store on its first request
    return web_state(client.app).store


def _chats(client: TestClient) -> Any:
    return web_state(client.app).chats


def _new_chat(client: TestClient, content: str, **form: str) -> str:
    r = client.post("/ui/chats", data={"content": content, **form}, headers=HX)
    assert r.status_code == 200, r.text
    return r.headers["hx-redirect"].rsplit("/", 1)[1]


def _wait_done(client: TestClient, conv_id: str, timeout: float = 10) -> Any:
    wait_until(lambda: not _chats(client).is_generating(conv_id), timeout, "the answer finished")
    return _store(client).get_messages(conv_id)


def test_pages_carry_csp_and_escape_everything(client: TestClient) -> None:
    conv_id = _new_chat(client, XSS_TITLE + " <<say:ok>>")
    _wait_done(client, conv_id)
    r = client.get(f"/c/{conv_id}")
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "<script>alert" not in r.text
    assert "&lt;script&gt;alert(&#34;t&#34;)&lt;/script&gt; &amp; &#34;quotes&#34;" in r.text
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", r.text) is None, "no inline script on the page"
    # The model picker: the loaded model, then the other local ones; the Models page is one click away.
    assert '<option value="fake-model" selected>fake-model · loaded</option>' in r.text
    assert 'href="/ui/models"' in r.text


def test_state_changes_need_the_htmx_header(client: TestClient) -> None:
    r = client.post("/ui/chats", data={"content": "hi"})
    assert r.status_code == 403
    assert _store(client).list_conversations() == []


def test_answer_is_generated_and_saved_without_any_client_watching(client: TestClient) -> None:
    conv_id = _new_chat(client, "<<slow:5>><<say:Saved **server-side**.>>")
    # Nobody opens the stream (the tab closed at once); the server finishes and stores the answer.
    user, answer = _wait_done(client, conv_id)
    assert (user.role, answer.role, answer.status) == ("user", "assistant", DONE)
    assert answer.content == "Saved **server-side**."
    assert answer.completion_tokens == len(answer.content.encode()) + 1  # + EOS
    assert answer.prompt_tokens > 0 and answer.finish_reason == "stop"
    page = client.get(f"/c/{conv_id}").text
    assert "Saved **server-side**." in page and f"{answer.completion_tokens} tokens" in page


def test_stream_sends_snapshot_deltas_then_the_final_message(client: TestClient) -> None:
    conv_id = _new_chat(client, "<<slow:30>><<say:one two three four five>>")
    answer = _store(client).get_messages(conv_id)[1]
    events: list[tuple[str, str]] = []
    with client.stream("GET", f"/ui/m/{answer.id}/stream") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        event, data = "", []
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and event:
                events.append((event, "\n".join(data)))
                event, data = "", []
                if events[-1][0] == "done":
                    break
    kinds = [k for k, _ in events]
    assert kinds[0] == "snapshot" and kinds[-1] == "done" and kinds.count("delta") >= 3
    assert "".join(d for k, d in events if k in ("snapshot", "delta")) == "one two three four five"
    final = events[-1][1]
    assert 'data-status="done"' in final and "sse-connect" not in final and "one two three four five" in final


def test_stream_of_a_finished_answer_is_just_done(client: TestClient) -> None:
    conv_id = _new_chat(client, "<<say:x>>")
    answer = _wait_done(client, conv_id)[1]
    with client.stream("GET", f"/ui/m/{answer.id}/stream") as r:
        body = r.read().decode()
    assert body.startswith("event: done") and "snapshot" not in body


def test_stop_aborts_and_frees_the_kv_blocks(client: TestClient) -> None:
    conv_id = _new_chat(client, "<<slow:20>><<say:" + "long answer " * 40 + ">>")
    engine = client.app.state.models.current().engine
    wait_until(lambda: engine.stats().kv_blocks_used > 0, 5, "the answer holds KV blocks")
    time.sleep(0.1)  # a few tokens into the answer, so the stop leaves a partial one
    assert client.post(f"/ui/c/{conv_id}/stop", headers=HX).status_code == 204
    answer = _wait_done(client, conv_id)[1]
    assert answer.status == STOPPED and 0 < len(answer.content) < len("long answer " * 40)
    wait_until(
        lambda: (engine.stats().num_running, engine.stats().kv_blocks_used) == (0, 0), 5, "blocks freed"
    )
    assert "Stopped." in client.get(f"/c/{conv_id}").text


def test_regenerate_replaces_the_last_answer(client: TestClient) -> None:
    conv_id = _new_chat(client, "<<say:first>>")
    old = _wait_done(client, conv_id)[1]
    r = client.post(f"/ui/c/{conv_id}/regenerate", headers=HX)
    assert r.status_code == 200 and 'data-status="streaming"' in r.text
    messages = _wait_done(client, conv_id)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[1].id != old.id
    assert messages[1].content == "first"


def test_edit_replaces_the_message_and_drops_later_history(client: TestClient) -> None:
    conv_id = _new_chat(client, "<<say:A>>")
    user = _wait_done(client, conv_id)[0]
    client.post(f"/ui/c/{conv_id}/messages", data={"content": "second question"}, headers=HX)
    assert len(_wait_done(client, conv_id)) == 4
    r = client.post(f"/ui/c/{conv_id}/m/{user.id}/edit", data={"content": "<<say:B>>"}, headers=HX)
    assert r.status_code == 200
    messages = _wait_done(client, conv_id)
    assert [(m.role, m.content) for m in messages] == [("user", "<<say:B>>"), ("assistant", "B")]
    assert messages[0].id == user.id


def test_busy_conversation_refuses_a_second_message_with_a_notice(client: TestClient) -> None:
    conv_id = _new_chat(client, "<<slow:20>><<say:" + "x" * 100 + ">>")
    r = client.post(f"/ui/c/{conv_id}/messages", data={"content": "again"}, headers=HX)
    assert r.status_code == 400
    assert r.headers["hx-retarget"] == "#notice" and "press Stop" in r.text
    client.post(f"/ui/c/{conv_id}/stop", headers=HX)
    _wait_done(client, conv_id)


def test_context_too_long_is_an_inline_error_that_suggests_a_new_chat(client: TestClient) -> None:
    conv_id = _new_chat(client, "y" * 5000)  # the fake model has 4096 tokens of context, one per byte
    answer = _store(client).get_messages(conv_id)[1]
    assert answer.status == ERROR and "maximum context length is 4096" in answer.error
    page = client.get(f"/c/{conv_id}").text
    assert 'class="msg-error"' in page and "Start a new chat" in page


def test_settings_are_validated_saved_and_used(client: TestClient) -> None:
    form = {"system_prompt": "Be terse.", "temperature": "0.2", "top_p": "", "max_tokens": "4"}
    conv_id = _new_chat(client, "<<say:a long reply here>>", **form)
    conv = _store(client).get_conversation(conv_id)
    assert (conv.system_prompt, conv.temperature, conv.top_p, conv.max_tokens) == ("Be terse.", 0.2, None, 4)
    answer = _wait_done(client, conv_id)[1]
    assert (answer.content, answer.finish_reason) == ("a lo", "length")
    assert "max tokens limit" in client.get(f"/c/{conv_id}").text
    bad = client.post(f"/ui/c/{conv_id}/settings", data={**form, "top_p": "0"}, headers=HX)
    assert bad.status_code == 400 and "Top P" in bad.text
    bad = client.post(f"/ui/c/{conv_id}/settings", data={**form, "temperature": "warm"}, headers=HX)
    assert bad.status_code == 400 and "Temperature must be a number" in bad.text
    ok = client.post(f"/ui/c/{conv_id}/settings", data={**form, "max_tokens": ""}, headers=HX)
    assert ok.status_code == 200 and _store(client).get_conversation(conv_id).max_tokens is None


def test_sidebar_search_rename_delete(client: TestClient) -> None:
    a = _new_chat(client, "Cooking pasta <<say:boil>>")
    b = _new_chat(client, "Trains <<say:fast>>")
    _wait_done(client, a), _wait_done(client, b)
    listing = client.get("/ui/conversations", params={"q": "pasta"}).text
    assert f"conv-{a}" in listing and f"conv-{b}" not in listing
    r = client.post(
        f"/ui/c/{a}/rename", data={"title": XSS_TITLE}, headers={**HX, "HX-Current-URL": f"http://x/c/{a}"}
    )
    assert "&lt;script&gt;" in r.text and 'hx-swap-oob="true"' in r.text  # the open chat's header too
    r = client.delete(f"/ui/c/{b}", headers={**HX, "HX-Current-URL": f"http://x/c/{a}"})
    assert r.status_code == 200 and "hx-redirect" not in r.headers
    r = client.delete(f"/ui/c/{a}", headers={**HX, "HX-Current-URL": f"http://x/c/{a}"})
    assert r.headers["hx-redirect"] == "/"
    assert _store(client).list_conversations() == []
    assert client.get(f"/c/{a}").status_code == 404


def test_export_markdown_json_and_import_round_trip(client: TestClient) -> None:
    conv_id = _new_chat(
        client, "Question? <<say:<think>hmm</think>Answer.>>", system_prompt="Sys", temperature="0.5"
    )
    _wait_done(client, conv_id)
    md = client.get(f"/ui/c/{conv_id}/export/md")
    assert md.headers["content-disposition"].startswith("attachment;")
    assert (
        "## System\n\nSys" in md.text
        and "> **Thinking**" in md.text
        and "> hmm" in md.text
        and "Answer." in md.text
    )
    exported = client.get(f"/ui/c/{conv_id}/export/json").json()
    assert exported["format"] == "localchat.conversation" and exported["settings"]["temperature"] == 0.5
    files = {"file": ("chat.json", json.dumps(exported).encode(), "application/json")}
    r = client.post("/ui/import", files=files, headers=HX)
    new_id = r.headers["hx-redirect"].rsplit("/", 1)[1]
    assert new_id != conv_id
    again = client.get(f"/ui/c/{new_id}/export/json").json()
    for key in ("title", "settings"):
        assert again[key] == exported[key]
    assert [(m["role"], m["content"]) for m in again["messages"]] == [
        (m["role"], m["content"]) for m in exported["messages"]
    ]
    bad = client.post("/ui/import", files={"file": ("x.json", b"{not json", "application/json")}, headers=HX)
    assert bad.status_code == 400 and "not valid JSON" in bad.text


def test_history_sent_to_the_model_drops_thinking_and_failed_answers(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv_id = _new_chat(client, "<<say:<think>secret</think>visible>>", system_prompt="S")
    _wait_done(client, conv_id)
    seen: list[list[dict[str, Any]]] = []
    original = chat_render.render_chat

    def spy(template: Any, tokenizer: Any, messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> str:
        seen.append(messages)
        return original(template, tokenizer, messages, *args, **kwargs)

    monkeypatch.setattr(chat_render, "render_chat", spy)  # the prompt is rendered on a worker thread
    client.post(f"/ui/c/{conv_id}/messages", data={"content": "next"}, headers=HX)
    _wait_done(client, conv_id)
    assert seen[-1] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "<<say:<think>secret</think>visible>>"},
        {"role": "assistant", "content": "visible"},
        {"role": "user", "content": "next"},
    ]


def test_login_sets_the_cookie_the_auth_guard_accepts(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path, api_key="s3cret")
    with TestClient(app) as client:
        r = client.get("/c/abc", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/login?next=/c/abc"
        assert client.get("/login").status_code == 200
        assert client.get("/static/app.css").status_code == 200  # assets are public
        wrong = client.post("/login", data={"api_key": "nope", "next": "/"}, follow_redirects=False)
        assert wrong.status_code == 401 and "not the one" in wrong.text
        ok = client.post(
            "/login", data={"api_key": "s3cret", "next": "//evil.example"}, follow_redirects=False
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/"
        cookie = ok.headers["set-cookie"]
        assert (
            "localchat_api_key=s3cret" in cookie
            and "HttpOnly" in cookie
            and "samesite=strict" in cookie.lower()
        )
        assert client.get("/").status_code == 200  # the client now sends the cookie


def test_the_ui_samples_with_the_same_defaults_as_the_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One resolution for both: request/conversation > server flags > generation_config > 1.0."""
    flags = {
        "top_k": 7,
        "min_p": 0.05,
        "frequency_penalty": 0.3,
        "presence_penalty": 0.2,
        "repetition_penalty": 1.1,
    }
    app, ctx = fake_app(tmp_path, max_gen_tokens=300, **flags)
    ctx.model.generation_defaults = {"temperature": 0.6, "top_p": 0.9, "top_k": 50}
    submitted: list[Any] = []
    submit = ctx.engine.submit
    monkeypatch.setattr(
        ctx.engine, "submit", lambda ids, params, *a: submitted.append(params) or submit(ids, params, *a)
    )
    with TestClient(app) as client:
        _wait_done(client, _new_chat(client, "<<say:ui>>"))
        api = client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "<<say:api>>"}]}
        )
        assert api.status_code == 200, api.text
        _wait_done(client, _new_chat(client, "<<say:ui>>", temperature="0.25", max_tokens="9"))
        body = {
            "messages": [{"role": "user", "content": "<<say:api>>"}],
            "temperature": 0.25,
            "max_tokens": 9,
        }
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    ui, api_params, ui_set, api_set = submitted
    assert ui == api_params
    assert (ui.temperature, ui.top_p, ui.top_k, ui.min_p, ui.max_tokens) == (0.6, 0.9, 7, 0.05, 300)
    assert (ui.frequency_penalty, ui.presence_penalty, ui.repetition_penalty) == (0.3, 0.2, 1.1)
    assert ui_set == api_set and (ui_set.temperature, ui_set.max_tokens) == (0.25, 9)


def test_a_slow_disk_write_does_not_stall_other_streams(tmp_path: Path) -> None:
    """Store writes run on the store thread: while one answer's final save hangs on the disk, an API
    stream on the same server is served at full speed, and the answer is only 'done' once saved."""
    delay_s = 2.0
    app, _ = fake_app(tmp_path)
    with TestClient(app) as client:
        store = _store(client)
        writing = threading.Event()
        original = store.update_message

        def slow_update(message_id: int, **fields: Any) -> None:
            if fields.get("status") == DONE:  # the answer's final save
                writing.set()
                time.sleep(delay_s)
            original(message_id, **fields)

        store.update_message = slow_update
        conv_id = _new_chat(client, "<<say:saved slowly>>")
        assert writing.wait(10), "the final save never started"
        started = time.monotonic()
        body = {"messages": [{"role": "user", "content": "<<say:still streaming>>"}], "stream": True}
        r = client.post("/v1/chat/completions", json=body)
        elapsed = time.monotonic() - started
        assert r.status_code == 200 and "data: [DONE]" in r.text
        assert "".join(re.findall(r'"content":"([^"]*)"', r.text)) == "still streaming"
        assert elapsed < delay_s / 2, f"the API stream waited {elapsed:.2f}s for the store"
        assert _chats(client).is_generating(conv_id)  # not done before its final state is on disk
        answer = _wait_done(client, conv_id)[1]
        assert (answer.content, answer.status) == ("saved slowly", DONE)
