"""Tool-call parsers: every format, whole and cut into random pieces (streamed == non-streamed),
markup split across pieces, malformed JSON, text around calls, parallel calls, parser selection."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from localchat.serving.tool_parsers import PARSER_CHOICES, PARSERS, ToolCallStream, parse, pick_parser
from localchat.serving.tool_parsers.stream import CallDelta, collect

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
NAMES = {"get_weather", "get_time"}

# (parser, model output, expected content, expected [(name, arguments)])
CASES = [
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Let me check.",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET", "n": [1, {"x": "}"}]}}\n</tool_call>',
        "",
        [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET", "n": [1, {"x": "}"}]}')],
    ),
    (
        "hermes",
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\nDone, see above.',
        "Done, see above.",
        [("get_time", "{}")],
    ),
    ("hermes", "Use a <tool_call> tag? No.", "Use a <tool_call> tag? No.", []),
    (  # tags that are special tokens, dropped by the detokenizer
        "hermes",
        '\n{"name": "get_time", "arguments": {}}\n',
        "",
        [("get_time", "{}")],
    ),
    ("hermes", "a <tool_call>{not json}</tool_call> b", "a <tool_call>{not json}</tool_call> b", []),
    ("hermes", "Ends with a partial <tool_ca", "Ends with a partial <tool_ca", []),
    (
        "hermes",  # keys in the other order: the call arrives whole
        '<tool_call>{"arguments": {"city": "Rome"}, "name": "get_weather"}</tool_call>',
        "",
        [("get_weather", '{"city": "Rome"}')],
    ),
    (
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}',
        "",
        [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")],
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "get_time", "parameters": {"tz": "UTC"}}',
        "",
        [("get_time", '{"tz": "UTC"}')],
    ),
    ("llama3", '{"name": "unknown_fn", "parameters": {}}', '{"name": "unknown_fn", "parameters": {}}', []),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3", "The weather is nice.", "The weather is nice.", []),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1b2c3d4e"}, '
        '{"name": "get_time", "arguments": {"tz": "CET"}}]',
        "",
        [("get_weather", '{"city": "Oslo"}'), ("get_time", '{"tz": "CET"}')],
    ),
    ("mistral", "[TOOL_CALLS] [oops]", "[TOOL_CALLS] [oops]", []),
    (  # the special token dropped by the detokenizer
        "mistral",
        ' [{"name": "get_time", "arguments": {"tz": "UTC"}}]',
        "",
        [("get_time", '{"tz": "UTC"}')],
    ),
    (
        "json",
        '[{"name": "get_weather", "arguments": "{\\"city\\": \\"Lima\\"}"}]',
        "",
        [("get_weather", '{"city": "Lima"}')],
    ),
    (
        "json",
        'Here: {"name": "get_time", "arguments": {}}',
        'Here: {"name": "get_time", "arguments": {}}',
        [],
    ),
]


def _calls(out):
    return [(c.name, c.arguments) for c in out.calls]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_non_streaming(fmt, text, content, calls):
    out = parse(PARSERS[fmt](), text, NAMES)
    assert out.content == content
    assert _calls(out) == calls
    assert all(c.id.startswith("call_") for c in out.calls)
    assert len({c.id for c in out.calls}) == len(out.calls)


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
@pytest.mark.parametrize("seed", range(8))
def test_streaming_any_cut_equals_whole(fmt, text, content, calls, seed):
    rng = random.Random(seed)
    stream = ToolCallStream(PARSERS[fmt](), NAMES)
    events, i = [], 0
    while i < len(text):
        step = 1 if seed == 0 else rng.randint(1, 7)  # seed 0: one character per piece
        events += stream.push(text[i : i + step])
        i += step
    events += stream.flush()
    out = collect(events)
    assert (out.content, _calls(out)) == (content, calls)
    # Contract rule 5: a call's first delta has id and name, later ones only arguments; no interleaving.
    deltas = [e for e in events if isinstance(e, CallDelta)]
    for previous, delta in itertools.pairwise(deltas):
        assert delta.index in (previous.index, previous.index + 1)
    for index in range(len(calls)):
        first, *rest = [d for d in deltas if d.index == index]
        assert first.id and first.name
        assert all(d.id is None and d.name is None and d.arguments for d in rest)


def test_markup_is_never_sent_as_content_while_it_may_still_be_a_call():
    stream = ToolCallStream(PARSERS["hermes"](), NAMES)
    assert stream.push("Checking <tool") == ["Checking"]
    assert stream.push("_") == []
    events = stream.push('call>{"name": "get_time", "arguments": {"tz"')
    assert isinstance(events[0], CallDelta) and events[0].name == "get_time"
    assert "".join(e.arguments for e in events if isinstance(e, CallDelta)) == '{"tz"'


def test_text_that_only_looked_like_markup_is_released():
    stream = ToolCallStream(PARSERS["hermes"](), NAMES)
    assert stream.push("a <tool") == ["a"]
    assert stream.push("box> here") == [" <toolbox> here"]


def test_truncated_call_keeps_what_arrived():
    out = parse(PARSERS["hermes"](), '<tool_call>{"name": "get_time", "arguments": {"tz": "C', NAMES)
    assert _calls(out) == [("get_time", '{"tz": "C')] and out.content == ""


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", "arguments": {"city": "X"}}</tool_call>'
    out = parse(PARSERS["hermes"](), text, NAMES, max_calls=1)
    assert _calls(out) == [("get_time", "{}")]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("qwen2_5.jinja", "hermes"),
        ("qwen3.jinja", "hermes"),
        ("mistral_v0_3.jinja", "mistral"),
        ("llama3_1.jinja", "llama3"),
        ("llama3_2.jinja", "llama3"),
        ("smollm2.jinja", "json"),
    ],
)
def test_parser_picked_from_the_chat_template(template, expected):
    assert pick_parser("auto", (TEMPLATES / template).read_text()).name == expected


def test_setting_and_catalog_override_the_template():
    qwen = (TEMPLATES / "qwen2_5.jinja").read_text()
    assert pick_parser("llama3", qwen).name == "llama3"
    assert pick_parser("auto", qwen, catalog_hint="mistral").name == "mistral"


@pytest.mark.parametrize("fmt", sorted(n for n, p in PARSERS.items() if p.can_force))
def test_forced_call_text_parses_back(fmt):
    parser = PARSERS[fmt]()
    body = json.dumps({"name": "get_weather", parser.arguments_key: {"city": "Paris"}})
    out = parse(parser, parser.forced_prefix + body + parser.forced_suffix, NAMES)
    assert _calls(out) == [("get_weather", '{"city": "Paris"}')] and out.content == ""


def test_mistral_ids_become_nine_alphanumerics_for_its_template():
    parser = PARSERS["mistral"]()
    short = parser.template_call_id("call_abc")
    assert len(short) == 9 and short.isalnum() and parser.template_call_id("call_abc") == short
    assert parser.template_call_id("a1b2c3d4e") == "a1b2c3d4e"


def test_the_setting_offers_every_parser():
    from localchat.config import TOOL_CALL_PARSERS

    assert TOOL_CALL_PARSERS == PARSER_CHOICES
