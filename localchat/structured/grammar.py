"""llguidance behind the engine's `Constraint` / `TokenMatcher` protocols (localchat/engine/constraint.py).

Why llguidance: benchmarks/grammar_bench.py and docs/architecture.md ("Constrained decoding").
"""

from __future__ import annotations

from typing import Any

import llguidance
import llguidance.numpy as llnumpy
import numpy as np

from localchat.errors import InvalidRequestError

# Compact JSON with the spaces models are trained to write. Flexible whitespace lets a small model at
# temperature 1 pad forever instead of closing the object.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class GrammarMatcher:
    """One request's llguidance matcher."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        llnumpy.fill_next_token_bitmask(self._matcher, bitmask, row)

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

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, what: str, param: str) -> None:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise InvalidRequestError(f"{what} cannot be enforced: {messages[0]}", param=param)
        self._fresh = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._fresh.is_error():
            raise InvalidRequestError(f"{what} cannot be enforced: {self._fresh.get_error()}", param=param)
        self._words = -(-tokenizer.vocab_size // 32)

    @property
    def mask_words(self) -> int:
        return self._words

    def new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._fresh.deep_copy())


def json_schema_grammar(schema: dict[str, Any] | bool) -> str:
    """An llguidance grammar (its JSON form) for documents that validate against `schema`."""
    return llguidance.LLMatcher.grammar_from_json_schema(_as_schema(schema), overrides=JSON_OPTIONS)  # type: ignore[arg-type]


def json_schema_constraint(
    tokenizer: llguidance.LLTokenizer, schema: dict[str, Any] | bool, param: str = "response_format"
) -> CompiledGrammar:
    """400 (InvalidRequestError) naming the feature when the schema uses one the engine cannot enforce."""
    try:
        grammar = json_schema_grammar(schema)
    except ValueError as exc:
        raise InvalidRequestError(f"The JSON schema is not valid: {exc}", param=param) from None
    return CompiledGrammar(tokenizer, grammar, "The JSON schema", param)


def json_object_constraint(tokenizer: llguidance.LLTokenizer) -> CompiledGrammar:
    """Any JSON object (response_format json_object)."""
    return json_schema_constraint(tokenizer, {"type": "object"})


def _as_schema(schema: dict[str, Any] | bool) -> dict[str, Any]:
    if schema is True:
        return {}
    if schema is False:
        raise InvalidRequestError("The JSON schema `false` accepts no document.", param="response_format")
    return schema
