"""Constrained decoding in the engine (fake runner, real llguidance grammars): the grammar steers every
token, finishes the request, and each request sees the same masks alone, batched, and preempted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from localchat.backends.fake import FakeRunner, FakeTokenizer
from localchat.engine.constraint import new_bitmask, unpack_bitmask
from localchat.engine.engine import LLMEngine
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import InvalidRequestError
from localchat.structured.grammar import json_object_constraint, json_schema_constraint
from localchat.structured.tool_grammar import tool_call_constraint
from localchat.structured.vocabulary import grammar_tokenizer
from tests.helpers.fake_engine import chat_prompt, fake_engine

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}, "color": {"enum": ["red", "green"]}},
    "required": ["n", "color"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def vocabulary():  # type: ignore[no-untyped-def]
    tokenizer = FakeTokenizer()
    return grammar_tokenizer(tokenizer, tokenizer.vocab_size)


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[tuple[str, object]]:
    ids = [engine.add_request(p, params) for p in prompts]
    texts, reasons = dict.fromkeys(ids, ""), {}
    while engine.has_unfinished:
        for out in engine.step():
            texts[out.req_id] += out.text_delta
            if out.finished:
                reasons[out.req_id] = (out.finish_reason, out.error)
    return [(texts[i], reasons[i]) for i in ids]


def test_grammar_overrides_the_script_and_stops_the_request(vocabulary) -> None:  # type: ignore[no-untyped-def]
    engine = fake_engine()
    params = SamplingParams(
        temperature=0, max_tokens=200, constraint=json_schema_constraint(vocabulary, SCHEMA)
    )
    # The script says blue (not in the enum) and then rambles on after the object.
    [(text, reason)] = run(engine, [chat_prompt('<<say:{"n": 12, "color": "blue"} and more>>')], params)
    assert json.loads(text) == {"n": 12, "color": "green"}
    assert reason == (FinishReason.STOP, None)


def test_json_object_and_forced_tool_call_outputs_parse(vocabulary) -> None:  # type: ignore[no-untyped-def]
    [(text, _)] = run(
        fake_engine(),
        [chat_prompt('<<say:{"a": [1, true]} and then prose>>')],
        SamplingParams(temperature=0, max_tokens=400, constraint=json_object_constraint(vocabulary)),
    )
    assert json.loads(text) == {"a": [1, True]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
    forced = tool_call_constraint(vocabulary, tools, "required", "<tool_call>\n", "\n</tool_call>")
    [(text, reason)] = run(
        fake_engine(),
        [chat_prompt("<<say:I will not call it>>")],
        SamplingParams(temperature=0, max_tokens=400, constraint=forced),
    )
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call["name"] == "get_weather" and set(call["arguments"]) == {"n", "color"}
    assert reason == (FinishReason.STOP, None)


def run_recording(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams):  # type: ignore[no-untyped-def]
    """(texts, the bitmask rows each request was given, in request order)."""
    runner = engine.runner
    assert isinstance(runner, FakeRunner)
    runner.record_masks = True
    texts = [text for text, _ in run(engine, prompts, params)]
    return texts, [runner.masks[f"req-{i}"] for i in range(len(prompts))]


def test_masks_are_identical_alone_batched_and_preempted(vocabulary) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(
        temperature=0, max_tokens=200, constraint=json_schema_constraint(vocabulary, SCHEMA)
    )
    prompts = [chat_prompt(f'<<say:{{"n": {i * 1111}, "color": "red"}}>>' + "x" * (i * 7)) for i in range(12)]
    alone = [run_recording(fake_engine(), [p], params) for p in prompts]
    tight = fake_engine(kv_bytes_per_token=4096, block_size=4)  # ~256 tokens of KV: forces preemption
    texts, masks = run_recording(tight, prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert texts == [t[0] for t, _ in alone]
    assert masks == [m[0] for _, m in alone]
    assert [json.loads(t)["n"] for t in texts] == [i * 1111 for i in range(12)]


def test_rows_without_a_grammar_get_no_mask(vocabulary) -> None:  # type: ignore[no-untyped-def]
    engine = fake_engine()
    engine.runner.record_masks = True  # type: ignore[attr-defined]
    run(engine, [chat_prompt("<<say:free text>>")], SamplingParams(temperature=0, max_tokens=50))
    assert engine.runner.masks == {}  # type: ignore[attr-defined]


def test_uncompilable_schema_names_the_feature(vocabulary) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequestError, match="uniqueItems"):
        json_schema_constraint(vocabulary, {"type": "array", "uniqueItems": True})
    with pytest.raises(InvalidRequestError, match="format"):
        json_schema_constraint(vocabulary, {"type": "string", "format": "no-such-format"})


def test_mask_width_covers_a_model_vocab_larger_than_the_tokenizer() -> None:
    tokenizer = FakeTokenizer()
    padded = tokenizer.vocab_size + 100  # padded embedding rows the tokenizer never produces
    constraint = json_object_constraint(grammar_tokenizer(tokenizer, padded))
    assert constraint.mask_words == -(-padded // 32)
    bitmask = new_bitmask(1, constraint.mask_words)
    constraint.new_matcher().fill_bitmask(bitmask, 0)
    allowed = unpack_bitmask(bitmask, padded)[0]
    assert allowed[tokenizer.encode("{")[0]] and not allowed[tokenizer.vocab_size :].any()


def test_unpack_bitmask_is_little_endian_per_word() -> None:
    bitmask = np.array([[0b101, -(2**31)]], dtype=np.int32)  # tokens 0, 2 and 63
    assert np.flatnonzero(unpack_bitmask(bitmask, 70)[0]).tolist() == [0, 2, 63]


def test_a_token_the_grammar_refuses_fails_only_that_request(vocabulary) -> None:  # type: ignore[no-untyped-def]
    engine = fake_engine()
    runner = engine.runner
    assert isinstance(runner, FakeRunner)
    runner._masked = lambda req_id, words, token: token  # type: ignore[method-assign]  # a runner ignoring masks
    params = SamplingParams(
        temperature=0, max_tokens=50, constraint=json_schema_constraint(vocabulary, SCHEMA)
    )
    ids = [engine.add_request(chat_prompt("<<say:not json>>"), params)]
    ids.append(
        engine.add_request(chat_prompt("<<say:free text>>"), SamplingParams(temperature=0, max_tokens=50))
    )
    finished = {}
    while engine.has_unfinished:
        for out in engine.step():
            if out.finished:
                finished[out.req_id] = out
    assert finished[ids[0]].finish_reason == FinishReason.ERROR
    assert "left its grammar" in (finished[ids[0]].error or "")
    assert finished[ids[1]].finish_reason == FinishReason.STOP
    assert engine.block_manager.num_used_blocks == 0


def test_numbers_without_a_step_get_nine_decimals_at_most() -> None:
    # SmolLM2 wrote "11.1111111…" until max_tokens under an unbounded number; 9 decimals lose nothing real.
    from localchat.structured.grammar import NUMBER_STEP, bound_numbers

    schema = {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "y": {"type": ["number", "null"], "multipleOf": 0.5},
            "n": {"type": "integer"},
            "items": {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "string"}]}},
        },
    }
    bounded = bound_numbers(schema)
    props = bounded["properties"]
    assert props["x"]["multipleOf"] == NUMBER_STEP and props["y"]["multipleOf"] == 0.5
    assert "multipleOf" not in props["n"] and "multipleOf" not in schema["properties"]["x"]  # a copy
    assert props["items"]["items"]["anyOf"][0]["multipleOf"] == NUMBER_STEP
