"""Forced tool calls (`tool_choice` "required" or a named function) for gpt-oss's harmony format.

A harmony call is not JSON in markup but a message addressed to the function:
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}`, then the model's
end-of-call token (one of its end-of-turn tokens, which end every grammar). The markers are special
tokens, so the grammar names them as tokens: the model must emit those very tokens, never their text
spelled in pieces. A tokenizer without them (the fake backend's) gets them as plain text instead.
One call per answer: `<|call|>` ends the model's turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import llguidance

from localchat.structured.grammar import JSON_OPTIONS, CompiledGrammar, bound_numbers
from localchat.structured.tool_grammar import _call_schema, _chosen_functions
from localchat.structured.vocabulary import GrammarVocabulary

MARKERS = ("<|channel|>", "<|constrain|>", "<|message|>")


def harmony_call_constraint(
    vocabulary: GrammarVocabulary,
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any],
    is_token: Callable[[str], bool],
) -> CompiledGrammar:
    """`tools` in OpenAI's shape; `is_token(marker)`: the tokenizer has the marker as one token."""
    channel, constrain, message = (m if is_token(m) else json.dumps(m) for m in MARKERS)
    rules = []
    calls = []
    for n, function in enumerate(_chosen_functions(tools, tool_choice)):
        header = json.dumps(f"commentary to=functions.{function['name']} ")
        arguments = bound_numbers(_call_schema(function, "arguments")["properties"]["arguments"])
        schema = json.dumps(arguments | {"x-guidance": dict(JSON_OPTIONS)})
        rules.append(f'call_{n}: {channel} {header} {constrain} "json" {message} arguments_{n}')
        rules.append(f"arguments_{n}: %json {schema}")
        calls.append(f"call_{n}")
    grammar = llguidance.LLMatcher.grammar_from_lark(
        "start: " + " | ".join(calls) + "\n" + "\n".join(rules) + "\n"
    )
    return CompiledGrammar(vocabulary, grammar, "The tools' parameter schemas", "tools")
