"""Finding where a JSON value ends in text that may still be growing (a model's output mid-stream)."""

from __future__ import annotations

import re

_LITERAL = re.compile(r"-?[0-9][0-9.eE+\-]*|true|false|null")
_OPENERS = {"{": "}", "[": "]"}


class JsonSyntaxError(ValueError):
    """The text cannot be the start of a JSON value (as opposed to being an unfinished one)."""


def value_end(text: str, start: int) -> int | None:
    """Index just past the JSON value that begins at `text[start]`, or None while it is unfinished.

    Only the structure is checked (brackets, strings, escapes); the caller json-parses the slice.
    """
    if start >= len(text):
        return None
    first = text[start]
    if first == '"':
        return _string_end(text, start)
    if first in _OPENERS:
        return _container_end(text, start)
    match = _LITERAL.match(text, start)
    if match is None:
        raise JsonSyntaxError(f"unexpected {first!r}")
    # A literal that reaches the end of the text may go on in the next piece ("12" -> "123").
    return match.end() if match.end() < len(text) else None


def _string_end(text: str, start: int) -> int | None:
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == '"':
            return i + 1
        i += 1
    return None


def _container_end(text: str, start: int) -> int | None:
    closers = [_OPENERS[text[start]]]
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == '"':
            end = _string_end(text, i)
            if end is None:
                return None
            i = end
            continue
        if char in _OPENERS:
            closers.append(_OPENERS[char])
        elif char in "}]":
            if char != closers.pop():
                raise JsonSyntaxError(f"mismatched {char!r}")
            if not closers:
                return i + 1
        i += 1
    return None
