"""Forced tool calls (`tool_choice` "required" or a named function) as a grammar.

The tool-call parsers (localchat/serving/tool_parsers) define each format's three strings; the output is
then always `forced_prefix + {"name": NAME, ARGUMENTS_KEY: <arguments valid for that tool>} +
forced_suffix`, repeated for parallel calls, and nothing else.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from localchat.errors import InvalidRequestError
from localchat.structured.grammar import JSON_OPTIONS, CompiledGrammar, bound_numbers
from localchat.structured.vocabulary import GrammarVocabulary

ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}
MAX_PARALLEL_CALLS = 8


def tool_call_constraint(
    vocabulary: GrammarVocabulary,
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any],
    forced_prefix: str,
    forced_suffix: str,
    arguments_key: str = "arguments",
    *,
    parallel: bool = False,
    calls_inside_wrapper: bool = False,
) -> CompiledGrammar:
    """`tools` in OpenAI's shape (`{"type": "function", "function": {name, parameters}}`).

    `tool_choice` "required" allows any of the tools, `{"type": "function", "function": {"name": N}}`
    only N. With `parallel`, one to MAX_PARALLEL_CALLS calls: whole wrapped calls joined by a newline (Hermes), or with
    `calls_inside_wrapper` the calls joined by ", " inside one wrapper (Mistral's `[TOOL_CALLS] [a, b]`).
    """
    call = bound_numbers(
        {"anyOf": [_call_schema(f, arguments_key) for f in _chosen_functions(tools, tool_choice)]}
    )
    body = "body: %json " + json.dumps(call | {"x-guidance": dict(JSON_OPTIONS)})
    prefix, suffix = json.dumps(forced_prefix), json.dumps(forced_suffix)
    if not parallel:
        rules = f"start: {prefix} body {suffix}"
    elif calls_inside_wrapper:
        rules = f'start: {prefix} body (", " body)~0..{MAX_PARALLEL_CALLS - 1} {suffix}'
    else:
        rules = f'start: call ("\\n" call)~0..{MAX_PARALLEL_CALLS - 1}\ncall: {prefix} body {suffix}'
    grammar = llguidance.LLMatcher.grammar_from_lark(f"{rules}\n{body}\n")
    return CompiledGrammar(vocabulary, grammar, "The tools' parameter schemas", "tools")


def _chosen_functions(tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]) -> list[dict[str, Any]]:
    functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        functions = [f for f in functions if f.get("name") == name]
    if not functions:
        raise InvalidRequestError("'tool_choice' names no tool of the request.", param="tool_choice")
    return functions


def _call_schema(function: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    arguments = dict(function.get("parameters") or ANY_ARGUMENTS)
    if "properties" in arguments and "additionalProperties" not in arguments:
        # NOTE: closed, as OpenAI's strict mode does: a function takes the arguments it declares, and a
        # small model otherwise invents extra ones until max_tokens.
        arguments["additionalProperties"] = False
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: arguments},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }
