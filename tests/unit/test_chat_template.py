"""ChatTemplate renders exactly what transformers' apply_chat_template(tokenize=False) renders, on real templates."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import pytest

from localchat.errors import InvalidRequestError, ModelLoadError
from localchat.weights.chat_template import CHATML_FALLBACK, ChatTemplate

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "chat_templates"
# (bos, eos) as each model's tokenizer sets them; Qwen has no bos token, so `bos_token` is undefined there.
SPECIAL = {
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2_5": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "mistral_v0_3": ("<s>", "</s>"),
    "deepseek_r1_distill": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city — 天気",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. 東京"}},
            "required": ["city"],
        },
    },
}
ARGS = {"city": "東京 🌸"}


def _tool_turns(
    *, args_as_string: bool, content: str | None, call_id: str = "call12345"
) -> list[dict[str, Any]]:
    arguments: Any = json.dumps(ARGS, ensure_ascii=False) if args_as_string else ARGS
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [
        {"role": "user", "content": "What's the weather in Tokyo?"},
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": call_id,
            "name": "get_weather",
            "content": '{"temp_c": 21, "sky": "晴れ"}',
        },
    ]


CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "system_user": (
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}],
        {},
    ),
    "multi_turn": (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Name a colour."},
        ],
        {},
    ),
    "no_system": (
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye."},
        ],
        {},
    ),
    "non_ascii": ([{"role": "user", "content": "你好，世界 🌍 — «ça va?» <b>&'"}], {}),
    "tools": (
        [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in 東京?"}],
        {"tools": [WEATHER_TOOL]},
    ),
    "tool_calls_dict_args": (_tool_turns(args_as_string=False, content=None), {"tools": [WEATHER_TOOL]}),
    "tool_calls_str_args": (_tool_turns(args_as_string=True, content=""), {"tools": [WEATHER_TOOL]}),
}
# Each template with the cases it accepts in transformers itself (the others fail there by design).
SUPPORTED = {
    "smollm2": ["system_user", "multi_turn", "no_system", "non_ascii"],
    "llama3_1": ["system_user", "multi_turn", "no_system", "non_ascii", "tools", "tool_calls_dict_args"],
    "llama3_2": ["system_user", "multi_turn", "no_system", "non_ascii", "tools", "tool_calls_dict_args"],
    "qwen2_5": list(CASES),
    # Qwen3 reads `message.content` of tool-call turns, so OpenAI's `content: null` fails there (in HF too).
    "qwen3": [case for case in CASES if case != "tool_calls_dict_args"],
    "mistral_v0_3": ["system_user", "multi_turn", "no_system", "non_ascii", "tools", "tool_calls_dict_args"],
    "deepseek_r1_distill": ["system_user", "multi_turn", "no_system", "non_ascii", "tool_calls_str_args"],
}
PAIRS = [(name, case) for name, cases in SUPPORTED.items() for case in cases]


@cache
def _source(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


@cache
def _hf_tokenizer(source: str, bos: str | None, eos: str | None) -> Any:
    vocab = {"a": 0, **{tok: i + 1 for i, tok in enumerate(t for t in (bos, eos) if t)}}
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, chat_template=source
    )


def hf_render(
    source: str, messages: list[dict[str, Any]], special: tuple[str | None, str | None], **kw: Any
) -> str:
    return _hf_tokenizer(source, *special).apply_chat_template(messages, tokenize=False, **kw)


def ours(name: str) -> ChatTemplate:
    bos, eos = SPECIAL[name]
    return ChatTemplate(_source(name), bos_token=bos, eos_token=eos)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(("name", "case"), PAIRS)
def test_matches_transformers(name: str, case: str, add_generation_prompt: bool) -> None:
    messages, kwargs = CASES[case]
    expected = hf_render(
        _source(name), messages, SPECIAL[name], add_generation_prompt=add_generation_prompt, **kwargs
    )
    got = ours(name).render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
    assert got == expected
    assert messages[-1]["content"] in got or case.startswith("tool_calls")


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_text_content_parts_are_flattened(name: str) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "世界 🌏"}]
    messages = [{"role": "user", "content": parts}]
    original = copy.deepcopy(messages)
    expected = hf_render(
        _source(name),
        [{"role": "user", "content": "Hello\n世界 🌏"}],
        SPECIAL[name],
        add_generation_prompt=True,
    )
    assert ours(name).render(messages) == expected
    assert messages == original  # the caller's messages are not modified


def test_content_parts_pass_through_unflattened_like_hf() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    # Llama trims content with `| trim`, which prints the Python list: same in both renderers.
    expected = hf_render(_source("llama3_1"), messages, SPECIAL["llama3_1"], add_generation_prompt=True)
    assert ours("llama3_1").render(messages, flatten_content=False) == expected
    assert "[{'type': 'text', 'text': 'Hello'}]" in expected
    # An image part keeps the list even when flattening, for templates that handle multimodal content.
    mixed = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    src = "{% for p in messages[0].content %}{{ p.type }};{% endfor %}"
    assert ChatTemplate(src).render(mixed) == "image;text;"


def test_unflattened_list_in_string_template_is_a_request_error() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    with pytest.raises(TypeError):  # transformers leaks the raw error
        hf_render(_source("smollm2"), messages, SPECIAL["smollm2"], add_generation_prompt=True)
    with pytest.raises(InvalidRequestError, match=r"could not render this conversation.*TypeError"):
        ours("smollm2").render(messages, flatten_content=False)


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_enable_thinking(enable_thinking: bool) -> None:
    messages = CASES["multi_turn"][0]
    expected = hf_render(
        _source("qwen3"),
        messages,
        SPECIAL["qwen3"],
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )
    got = ours("qwen3").render(messages, enable_thinking=enable_thinking)
    assert got == expected
    assert got.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") is (not enable_thinking)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_qwen3_reasoning_fields_reach_the_template(field: str) -> None:
    messages = _tool_turns(args_as_string=False, content="Let me check.")
    messages[1] = {**messages[1], field: "The user wants Tokyo weather."}
    expected = hf_render(_source("qwen3"), messages, SPECIAL["qwen3"], add_generation_prompt=True)
    got = ours("qwen3").render(messages)
    assert got == expected
    assert "<think>\nThe user wants Tokyo weather.\n</think>" in got


def test_deepseek_r1_strips_past_thinking_and_opens_a_think_block() -> None:
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
    ]
    expected = hf_render(
        _source("deepseek_r1_distill"), messages, SPECIAL["deepseek_r1_distill"], add_generation_prompt=True
    )
    got = ours("deepseek_r1_distill").render(messages)
    assert got == expected
    assert "add them" not in got
    assert got.endswith("<｜Assistant｜><think>\n")


@pytest.mark.parametrize("name", ["llama3_1", "llama3_2"])
def test_llama_date_string_passes_through(name: str) -> None:
    messages = CASES["tools"][0]
    kw = {"tools": [WEATHER_TOOL], "date_string": "01 Jan 2025"}
    expected = hf_render(_source(name), messages, SPECIAL[name], add_generation_prompt=True, **kw)
    got = ours(name).render(messages, **kw)
    assert got == expected
    assert "Today Date: 01 Jan 2025\n" in got


def test_llama_default_dates() -> None:
    messages = CASES["system_user"][0]
    assert "Today Date: 26 Jul 2024\n" in ours("llama3_1").render(messages)
    # Llama 3.2 asks strftime_now for today's date (both renderers run within the same second here).
    expected = hf_render(_source("llama3_2"), messages, SPECIAL["llama3_2"], add_generation_prompt=True)
    got = ours("llama3_2").render(messages)
    assert got == expected
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}\n" in got


def test_raise_exception_becomes_invalid_request_with_the_templates_message() -> None:
    messages = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    message = "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        hf_render(_source("mistral_v0_3"), messages, SPECIAL["mistral_v0_3"], add_generation_prompt=True)
    with pytest.raises(InvalidRequestError) as info:
        ours("mistral_v0_3").render(messages)
    assert info.value.message == message
    assert info.value.status == 400
    assert info.value.param == "messages"


def test_llama_refuses_parallel_tool_calls() -> None:
    messages = _tool_turns(args_as_string=False, content=None)
    messages[1]["tool_calls"] = messages[1]["tool_calls"] * 2
    with pytest.raises(InvalidRequestError, match=r"^This model only supports single tool-calls at once!$"):
        ours("llama3_1").render(messages, tools=[WEATHER_TOOL])


@pytest.mark.parametrize(
    "expr",
    [
        "x | tojson",
        "x | tojson(indent=2)",
        "x | tojson(indent=2, sort_keys=True)",
        "x | tojson(separators=(',', ':'))",
        "x | tojson(ensure_ascii=True)",
        "dict(b=1, a=[x.s]) | tojson",
        "dict.fromkeys(['k'], 0) | tojson",
    ],
)
def test_tojson_and_dict_match_hf(expr: str) -> None:
    source = "{{ " + expr + " }}"
    x = {"s": "<b>&'\"東京 🌸", "n": 1.5, "z": None, "a": [True, False]}
    expected = hf_render(source, [{"role": "user", "content": "x"}], (None, None), x=x)
    assert ChatTemplate(source).render([{"role": "user", "content": "x"}], x=x) == expected
    assert "&lt;" not in expected and "\\u003c" not in expected  # no HTML escaping, unlike Jinja's own tojson


def test_hf_extensions_loopcontrols_and_generation_tag() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    messages = CASES["no_system"][0]
    expected = hf_render(source, messages, (None, None), add_generation_prompt=False)
    assert ChatTemplate(source).render(messages) == expected == "Hi![Hello.]"


def test_trim_and_lstrip_blocks_like_hf() -> None:
    # Templates written without `{%-` rely on trim_blocks/lstrip_blocks to drop block lines entirely.
    source = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU: {{ m.content }}\n    {% endif %}\n{% endfor %}"
    messages = CASES["no_system"][0]
    expected = hf_render(source, messages, (None, None))
    assert ChatTemplate(source).render(messages) == expected == "U: Hi!\nU: Bye.\n"


def test_none_fields_are_dropped_like_hf() -> None:
    source = (
        "{{ messages[0].content is defined }}|{{ messages[0].tool_calls is defined }}|{{ messages[0].name }}"
    )
    messages = [{"role": "assistant", "content": None, "tool_calls": None, "name": "x"}]
    expected = hf_render(source, messages, (None, None))
    assert ChatTemplate(source).render(messages) == expected == "False|False|x"


def test_special_tokens_and_extra_kwargs() -> None:
    template = ChatTemplate(
        "{{ bos_token }}|{{ eos_token }}|{{ documents }}|{{ tools }}|{{ flag }}", bos_token="<s>"
    )
    assert template.render([]) == "<s>||None|None|"
    assert template.render([], bos_token="<B>", eos_token="</E>", flag=1) == "<B>|</E>|None|None|1"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ messages.append(1) }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ namespace(_x=1) }}",
    ],
)
def test_sandbox_escapes_are_blocked(source: str) -> None:
    with pytest.raises(InvalidRequestError, match="unsafe operation"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("{% for m in messages %}{{ m.content }}", "line 1"),
        ("{{ 1 }}\n{{ messages | no_such_filter }}", "line 2"),
        ("{% if %}", "line 1"),
    ],
)
def test_broken_template_is_a_model_load_error(source: str, where: str) -> None:
    with pytest.raises(ModelLoadError, match=f"chat template is not valid Jinja \\({where}\\)"):
        ChatTemplate(source)


def test_undefined_misuse_at_render_is_a_request_error() -> None:
    # Qwen2.5 concatenates message.content; a message without content cannot be rendered.
    with pytest.raises(InvalidRequestError, match=r"UndefinedError.*has no attribute 'content'"):
        ours("qwen2_5").render([{"role": "user"}])


def test_fallback_is_chatml() -> None:
    template = ChatTemplate(None)
    assert template.is_fallback and ChatTemplate("  \n").is_fallback and not ours("smollm2").is_fallback
    messages = [*CASES["system_user"][0], {"role": "assistant", "content": None, "tool_calls": []}]
    expected = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    expected += "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(messages) == expected
    assert hf_render(CHATML_FALLBACK, messages, (None, None), add_generation_prompt=True) == expected


@pytest.mark.parametrize(
    ("name", "tools", "thinking", "prompt", "end"),
    [
        ("smollm2", False, False, "<|im_start|>assistant\n", "<|im_end|>"),
        ("llama3_1", True, False, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
        ("qwen2_5", True, False, "<|im_start|>assistant\n", "<|im_end|>"),
        ("qwen3", True, True, "<|im_start|>assistant\n", "<|im_end|>"),
        ("mistral_v0_3", True, False, "", "</s>"),
        ("deepseek_r1_distill", False, False, "<｜Assistant｜><think>\n", "<｜end▁of▁sentence｜>"),
    ],
)
def test_template_facts(name: str, tools: bool, thinking: bool, prompt: str, end: str) -> None:
    template = ours(name)
    assert (template.renders_tools, template.supports_thinking) == (tools, thinking)
    assert template.generation_prompt == prompt
    assert template.end_of_turn == end


def test_compiled_once_per_source() -> None:
    assert ours("qwen3")._template is ours("qwen3")._template


@pytest.mark.slow
def test_smollm2_test_data_is_the_gguf_template(smollm2_gguf: Path) -> None:
    gguf = pytest.importorskip("gguf")
    field = gguf.GGUFReader(smollm2_gguf).fields["tokenizer.chat_template"]
    assert bytes(field.parts[field.data[0]]).decode("utf-8") == _source("smollm2")
