"""llguidance behind the engine's `Constraint` / `TokenMatcher` protocols (localchat/engine/constraint.py).

Why llguidance: benchmarks/grammar_bench.py and docs/architecture.md ("Constrained decoding").
"""

from __future__ import annotations

from typing import Any

import llguidance
import llguidance.numpy as llnumpy
import numpy as np

from localchat.errors import InvalidRequestError
from localchat.structured.vocabulary import GrammarVocabulary

# Compact JSON with the spaces models are trained to write. Flexible whitespace lets a small model at
# temperature 1 pad forever instead of closing the object.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class GrammarMatcher:
    """One request's llguidance matcher."""

    __slots__ = ("_matcher", "_words")

    def __init__(self, matcher: llguidance.LLMatcher, words: int) -> None:
        self._matcher = matcher
        self._words = words  # the tokenizer's; the model's logits may be wider

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        llnumpy.fill_next_token_bitmask(self._matcher, bitmask[:, : self._words], row)
        bitmask[row, self._words :] = 0  # ids past the tokenizer's vocabulary are never allowed

    def accept_token(self, token_id: int) -> bool:
        return self._matcher.consume_token(token_id)

    @property
    def is_finished(self) -> bool:
        return self._matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None


class CompiledGrammar:
    """A grammar compiled once for one tokenizer; every request gets a copy of the fresh matcher."""

    def __init__(self, vocabulary: GrammarVocabulary, grammar: str, what: str, param: str) -> None:
        tokenizer = vocabulary.tokenizer
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise InvalidRequestError(f"{what} cannot be enforced: {messages[0]}", param=param)
        self._fresh = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._fresh.is_error():
            raise InvalidRequestError(f"{what} cannot be enforced: {self._fresh.get_error()}", param=param)
        self._tokenizer_words = -(-tokenizer.vocab_size // 32)
        self._words = max(self._tokenizer_words, -(-vocabulary.model_vocab_size // 32))

    @property
    def mask_words(self) -> int:
        return self._words

    def new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._fresh.deep_copy(), self._tokenizer_words)


def json_schema_grammar(schema: dict[str, Any] | bool) -> str:
    """An llguidance grammar (its JSON form) for documents that validate against `schema`."""
    return llguidance.LLMatcher.grammar_from_json_schema(_as_schema(schema), overrides=JSON_OPTIONS)  # type: ignore[arg-type]


def json_schema_constraint(
    vocabulary: GrammarVocabulary, schema: dict[str, Any] | bool, param: str = "response_format"
) -> CompiledGrammar:
    """400 (InvalidRequestError) naming the feature when the schema uses one the engine cannot enforce."""
    try:
        grammar = json_schema_grammar(schema)
    except ValueError as exc:
        raise InvalidRequestError(f"The JSON schema is not valid: {exc}", param=param) from None
    return CompiledGrammar(vocabulary, grammar, "The JSON schema", param)


def json_object_constraint(vocabulary: GrammarVocabulary) -> CompiledGrammar:
    """A JSON object (response_format json_object), bounded so that it always ends (see JSON_OBJECT_LARK)."""
    grammar = llguidance.LLMatcher.grammar_from_lark(JSON_OBJECT_LARK)
    return CompiledGrammar(vocabulary, grammar, "json_object", "response_format")


# NOTE: not {"type": "object"}: unbounded keys and strings let a small model at temperature 1 write a key
# that never closes until max_tokens (seen with SmolLM2-135M). Here keys are names of up to 32 characters,
# strings up to 128, objects and arrays hold up to 8 items and nest 3 deep. A reply can still reach
# max_tokens first (finish_reason "length"), as with OpenAI.
JSON_OBJECT_LARK = r"""
start: object2
object2: "{" (KEY ": " value1 (", " KEY ": " value1)~0..7)? "}"
value1: leaf | "[" (value0 (", " value0)~0..7)? "]" | object1
object1: "{" (KEY ": " value0 (", " KEY ": " value0)~0..7)? "}"
value0: leaf | "[" (leaf (", " leaf)~0..7)? "]" | "{" (KEY ": " leaf (", " KEY ": " leaf)~0..7)? "}"
leaf: STRING | NUMBER | "true" | "false" | "null"
KEY: /"[A-Za-z_][A-Za-z0-9_ -]{0,31}"/
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]){0,128}"/
NUMBER: /-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,15})?([eE][+-]?[0-9]{1,3})?/
"""


# Fraction digits a JSON number may have unless its schema sets `multipleOf`: without a bound a small
# model can write "11.111111…" until max_tokens (SmolLM2 did, greedy). 9 decimals lose nothing real.
NUMBER_STEP = 1e-9


def _as_schema(schema: dict[str, Any] | bool) -> dict[str, Any]:
    if schema is True:
        return {}
    if schema is False:
        raise InvalidRequestError("The JSON schema `false` accepts no document.", param="response_format")
    return bound_numbers(schema)


def bound_numbers(node: Any) -> Any:
    """A copy of the schema in which every `number` without `multipleOf` gets NUMBER_STEP."""
    if isinstance(node, list):
        return [bound_numbers(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: bound_numbers(value) for key, value in node.items()}
    kind = out.get("type")
    is_number = kind == "number" or (isinstance(kind, list) and "number" in kind)
    if is_number and "multipleOf" not in out:
        out["multipleOf"] = NUMBER_STEP
    return out
