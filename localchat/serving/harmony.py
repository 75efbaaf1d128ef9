"""Reads gpt-oss's harmony-format output incrementally: reasoning, content and function calls.

After a prompt ending in `<|start|>assistant`, gpt-oss writes messages such as
`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`, and
calls a function with `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`
(the recipient may also stand right after the role: `<|start|>assistant to=functions.NAME<|channel|>…`).
The `analysis` channel is reasoning; `final` and plain `commentary` (the preamble to a call) are content;
a body sent to `functions.NAME` is a call's arguments; one sent to a built-in tool (`browser.search`,
`python`) is the model's own work, so reasoning. Headers and markers are dropped.

Streaming invariant as in reasoning.ReasoningSplitter: a tail that could begin a marker is held back
until the next delta decides it, so any cut into deltas yields the same pieces. The text must keep its
special tokens (decoded with skip_special_tokens off), since the markers are special tokens; any
other special-token-shaped piece (`<|endoftext|>`, the EOS the engine decodes too) is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

_ENDS = ("<|end|>", "<|return|>", "<|call|>")  # close a message body
_START = "<|start|>"
_CHANNEL = "<|channel|>"
_CONSTRAIN = "<|constrain|>"
_MESSAGE = "<|message|>"  # ends the header, starts the body
MARKERS = (*_ENDS, _START, _CHANNEL, _CONSTRAIN, _MESSAGE)
REASONING_CHANNEL = "analysis"
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"\bto=(\S+)")
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]+\|>")  # special-token shaped: <|endoftext|>, <|im_end|>
_MAX_SPECIAL = 48
_SPECIAL_PREFIX = re.compile(r"<\|[A-Za-z0-9_]*\|?")

Kind = Literal["reasoning", "content", "call", "arguments"]


@dataclass(slots=True)
class Piece:
    kind: Kind  # "call" opens a function call (text: its name); "arguments" continues the open one
    text: str


class HarmonyReader:
    """Harmony text in, pieces out. A call's arguments are the raw body the model wrote (JSON)."""

    def __init__(self) -> None:
        self._held = ""
        self._in_body = True  # text before any header counts as the final answer
        self._route: Kind = "content"
        self._header = ""  # role / recipient text of the header being read
        self._channel = ""  # the text after <|channel|> up to <|constrain|> or <|message|>
        self._part = "header"  # which of the two the header's text goes to, or "constrain"

    def push(self, text: str) -> list[Piece]:
        buf, self._held = self._held + text, ""
        out: list[Piece] = []
        while buf:
            at = buf.find("<|")
            if at < 0:
                keep = 1 if buf.endswith("<") else 0  # may become "<|" with the next delta
                self._text(buf[: len(buf) - keep], out)
                self._held = buf[len(buf) - keep :]
                break
            self._text(buf[:at], out)
            buf = buf[at:]
            marker = next((m for m in MARKERS if buf.startswith(m)), None)
            if marker is None:
                other = _SPECIAL.match(buf)
                if other is not None:  # another special token (an EOS decoded into the text): dropped
                    buf = buf[other.end() :]
                    continue
                if len(buf) < _MAX_SPECIAL and _SPECIAL_PREFIX.fullmatch(buf):  # cut at the delta's end
                    self._held = buf
                    break
                self._text("<|", out)  # not a marker: plain text
                buf = buf[2:]
                continue
            self._marker(marker, out)
            buf = buf[len(marker) :]
        return _merge(out)

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        self._text(self._held, out)
        self._held = ""
        return _merge(out)

    def _marker(self, marker: str, out: list[Piece]) -> None:
        if marker == _MESSAGE:
            self._open_body(out)
            return
        if self._in_body or marker in _ENDS or marker == _START:
            self._in_body = False
            self._header, self._channel, self._part = "", "", "header"
        if marker == _CHANNEL:
            self._part = "channel"
        elif marker == _CONSTRAIN:
            self._part = "constrain"

    def _open_body(self, out: list[Piece]) -> None:
        words = self._channel.split()
        channel = words[0] if words else "final"
        found = _RECIPIENT.search(f"{self._header} {self._channel}")
        recipient = found.group(1) if found else ""
        if recipient.startswith(FUNCTIONS):
            self._route = "arguments"
            out.append(Piece("call", recipient[len(FUNCTIONS) :]))
        elif (recipient and recipient != "assistant") or channel == REASONING_CHANNEL:
            self._route = "reasoning"
        else:
            self._route = "content"
        self._in_body = True

    def _text(self, piece: str, out: list[Piece]) -> None:
        if not piece:
            return
        if self._in_body:
            out.append(Piece(self._route, piece))
        elif self._part == "header":
            self._header += piece
        elif self._part == "channel":
            self._channel += piece


def _merge(pieces: list[Piece]) -> list[Piece]:
    merged: list[Piece] = []
    for p in pieces:
        if merged and p.kind != "call" and merged[-1].kind == p.kind:
            merged[-1].text += p.text
        else:
            merged.append(p)
    return merged


class HarmonySplitter:
    """(reasoning, content) only, for callers without tools: a call's arguments count as content."""

    def __init__(self) -> None:
        self._reader = HarmonyReader()

    def push(self, text: str) -> tuple[str, str]:
        return _split(self._reader.push(text))

    def flush(self) -> tuple[str, str]:
        return _split(self._reader.flush())


def _split(pieces: list[Piece]) -> tuple[str, str]:
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind in ("content", "arguments"))
    return reasoning, content


def split_harmony(text: str) -> tuple[str, str]:
    splitter = HarmonySplitter()
    r1, c1 = splitter.push(text)
    r2, c2 = splitter.flush()
    return r1 + r2, c1 + c2


def is_harmony_template(template_source: str | None) -> bool:
    """gpt-oss's chat templates write the harmony markers."""
    return (
        bool(template_source) and _CHANNEL in (template_source or "") and _MESSAGE in (template_source or "")
    )


class HarmonyThinkText:
    """Harmony output rewritten in the `<think>reasoning</think>answer` form that stored answers use
    (the web UI and the terminal chat read that form), incrementally. A call to one of `call_names` is
    kept aside in `calls` (name, arguments) instead of being written; any other call's arguments are
    text of the answer, as HarmonySplitter has them."""

    def __init__(self, call_names: Collection[str] = ()) -> None:
        self._reader = HarmonyReader()
        self._call_names = frozenset(call_names)
        self._thinking = False
        self._in_call = False  # the open call is one of call_names: its arguments go to `calls`
        self.calls: list[tuple[str, str]] = []

    def push(self, text: str) -> str:
        return self._text(self._reader.push(text))

    def flush(self) -> str:
        out = self._text(self._reader.flush())
        if self._thinking:  # an answer cut off while thinking still closes its block
            self._thinking = False
            out += "</think>"
        return out

    def _text(self, pieces: list[Piece]) -> str:
        out = ""
        for p in pieces:
            if p.kind == "call":
                self._in_call = p.text in self._call_names
                if self._in_call:
                    self.calls.append((p.text, ""))
                continue
            if p.kind == "arguments" and self._in_call:
                name, arguments = self.calls[-1]
                self.calls[-1] = (name, arguments + p.text)
                continue
            reasoning = p.kind == "reasoning"
            if reasoning != self._thinking:
                out += "<think>" if reasoning else "</think>"
                self._thinking = reasoning
            out += p.text
        return out
