"""Reads tool calls out of generated text, incrementally, for every format (see base.py).

Text arrives in arbitrary pieces; `push` returns what is safe to send now: content text, or call
deltas (a call's first delta has its id and name, the next ones pieces of its arguments). A tail
that could still become markup is held back until the next piece decides it; markup that turns out
not to hold a call is released as content. `parse` is one `push` plus `flush`, so streamed and
non-streamed answers agree.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from localchat.serving.tool_parsers.base import ToolParser
from localchat.serving.tool_parsers.json_scan import JsonSyntaxError, value_end

_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_SEPARATORS = " \t\r\n,;[]"
_CALL_KEYS = ('"name"', '"arguments"', '"parameters"')


@dataclass(slots=True)
class CallDelta:
    index: int
    id: str | None = None  # only on a call's first delta, with its name
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


Event = str | CallDelta


class _NotACall(Exception):
    """The markup or JSON seen so far does not hold a call after all."""


@dataclass(slots=True)
class _Region:
    close: str  # the closing markup, "" when the calls end at the first non-call text
    raw: str  # what the region consumed before its first call, released as content if none comes
    from_json_start: bool
    calls: int = 0


class ToolCallStream:
    """One choice's output. `names`: the request's tool names (a bare JSON object naming another
    function is text); `max_calls`: 1 when `parallel_tool_calls` is false (later calls are dropped)."""

    def __init__(
        self, parser: ToolParser, names: set[str] | None = None, max_calls: int | None = None
    ) -> None:
        self.parser = parser
        self.names = names or set()
        self.max_calls = max_calls
        self.num_calls = 0
        self._buf = ""
        self._region: _Region | None = None
        self._started = False  # non-whitespace content or a call was seen (bare JSON calls come first)
        self._strip_next = False  # whitespace right after calls separates, it is not content
        self._open_call: int | None = None  # index of the call whose arguments are streaming
        self._args_start = 0
        self._args_sent = 0
        self._emitting = True

    def push(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._buf and (self._step_region(out) if self._region else self._step_content(out)):
            pass
        return _merge(out)

    def flush(self) -> list[Event]:
        out: list[Event] = []
        region, rest, self._buf = self._region, self._buf, ""
        if region is None:
            if rest.strip() or not self.num_calls:
                out.append(rest)
        elif self._open_call is not None:
            self._open_call = None
        elif region.calls == 0:
            out.append(region.raw + rest)
        elif rest.strip(_SEPARATORS):
            out.append(rest.strip(_SEPARATORS))
        self._region = None
        return _merge(out)

    # -- content -------------------------------------------------------------------------------------

    def _step_content(self, out: list[Event]) -> bool:
        if self._strip_next:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._strip_next = False
        if self.parser.json_at_start and not self._started:
            stripped = self._buf.lstrip()
            verdict = _bare_call_start(stripped)
            if verdict is None:
                return False
            if verdict:
                raw = self._buf[: len(self._buf) - len(stripped)]
                self._region, self._buf, self._started = _Region("", raw, True), stripped, True
                return True
        found = _first_marker(self._buf, self.parser.markers)
        if found is not None:
            at, opening, closing = found
            before = self._buf[:at].rstrip()
            out.append(before)
            raw = self._buf[len(before) : at] + opening  # released as it was if no call follows
            self._buf = self._buf[at + len(opening) :]
            self._region, self._started = _Region(closing, raw, False), True
            return True
        keep = max((_partial_len(self._buf, m) for m, _ in self.parser.markers), default=0)
        safe = self._buf[: len(self._buf) - keep]
        emit = safe.rstrip()  # trailing whitespace waits: it is dropped if a call follows
        if emit:
            out.append(emit)
            self._started = True
        self._buf = self._buf[len(emit) :]
        return False

    # -- calls ---------------------------------------------------------------------------------------

    def _step_region(self, out: list[Event]) -> bool:
        region = self._region
        assert region is not None
        if self._open_call is not None:
            return self._step_arguments(out)
        skipped = len(self._buf) - len(self._buf.lstrip(_SEPARATORS))
        if region.calls == 0:
            region.raw += self._buf[:skipped]
        self._buf = self._buf[skipped:]
        if not self._buf:
            return False
        if region.close:
            if self._buf.startswith(region.close):
                self._buf = self._buf[len(region.close) :]
                self._end_region()
                return True
            if region.close.startswith(self._buf):
                return False
        try:
            if self._buf[0] != "{":
                raise _NotACall
            return self._step_call(out)
        except _NotACall:
            if region.calls == 0:
                out.append(region.raw)
            self._region = None
            self._strip_next = False
            return True

    def _end_region(self) -> None:
        region = self._region
        self._region = None
        self._strip_next = bool(region and region.calls)

    def _step_call(self, out: list[Event]) -> bool:
        region = self._region
        assert region is not None
        header = _HEADER.match(self._buf)
        if header is not None and header.end() < len(self._buf):  # the arguments' first character is in
            name = json.loads(f'"{header.group(1)}"')
            self._check_name(name, region)
            self._start_call(name, out)
            self._args_start, self._args_sent = header.end(), 0
            return self._step_arguments(out)
        # Keys in another order: wait for the whole object.
        try:
            end = value_end(self._buf, 0)
        except JsonSyntaxError:
            raise _NotACall from None
        if end is None:
            if region.close and region.close in self._buf:
                raise _NotACall
            return False
        try:
            obj = json.loads(self._buf[:end])
        except ValueError:
            raise _NotACall from None
        key = (
            next((k for k in ("arguments", "parameters") if k in obj), None)
            if isinstance(obj, dict)
            else None
        )
        if key is None or not isinstance(obj.get("name"), str):
            raise _NotACall
        self._check_name(obj["name"], region)
        args = obj[key]
        self._start_call(obj["name"], out)
        self._send_arguments(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False), out)
        self._finish_call(end)
        return True

    def _step_arguments(self, out: list[Event]) -> bool:
        start = self._args_start
        try:
            end = value_end(self._buf, start)
        except JsonSyntaxError:
            self._finish_call(start)  # the call stays with the arguments already sent
            self._region = None
            return True
        streams = self._buf[start : start + 1] in ("{", "[")
        if streams:
            upto = end if end is not None else len(self._buf)
            self._send_arguments(self._buf[start + self._args_sent : upto], out)
            self._args_sent = upto - start
        if end is None:
            return False
        outer = value_end(self._buf, 0)
        if outer is None:
            return False
        if not streams:
            value = json.loads(self._buf[start:end])
            self._send_arguments(value if isinstance(value, str) else self._buf[start:end], out)
        self._finish_call(outer)
        return True

    def _check_name(self, name: str, region: _Region) -> None:
        # Without markup, only a known function name makes a JSON reply a call.
        if region.from_json_start and self.names and name not in self.names:
            raise _NotACall

    def _start_call(self, name: str, out: list[Event]) -> None:
        self._emitting = self.max_calls is None or self.num_calls < self.max_calls
        self._open_call = self.num_calls
        if self._emitting:
            out.append(CallDelta(self.num_calls, self.parser.new_call_id(), name))
        assert self._region is not None
        self._region.calls += 1

    def _send_arguments(self, piece: str, out: list[Event]) -> None:
        if piece and self._emitting and self._open_call is not None:
            out.append(CallDelta(self._open_call, arguments=piece))

    def _finish_call(self, consumed: int) -> None:
        if self._emitting:
            self.num_calls += 1
        self._open_call = None
        self._buf = self._buf[consumed:]


def _bare_call_start(text: str) -> bool | None:
    """Whether `text` starts like a JSON call object or list of them; None while it cannot tell."""
    if not text:
        return None
    i = 0
    if text[0] == "[":
        i = len(text) - len(text[1:].lstrip()) if len(text) > 1 else 1
        if i >= len(text):
            return None
    if text[i] != "{":
        return False
    rest = text[i + 1 :].lstrip()
    if not rest:
        return None
    return any(key.startswith(rest) or rest.startswith(key) for key in _CALL_KEYS)


def _first_marker(text: str, markers: tuple[tuple[str, str], ...]) -> tuple[int, str, str] | None:
    hits = [(text.find(opening), opening, closing) for opening, closing in markers if opening in text]
    return min(hits) if hits else None


def _partial_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _merge(events: list[Event]) -> list[Event]:
    merged: list[Event] = []
    for e in events:
        if isinstance(e, str):
            if not e:
                continue
            if merged and isinstance(merged[-1], str):
                merged[-1] += e
                continue
        merged.append(e)
    return merged


@dataclass(slots=True)
class ParsedOutput:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


def collect(events: list[Event], into: ParsedOutput | None = None) -> ParsedOutput:
    """Folds events into content and whole calls."""
    result = into or ParsedOutput("")
    for e in events:
        if isinstance(e, str):
            result.content += e
        elif e.id is not None:
            result.calls.append(ParsedCall(e.id, e.name or "", e.arguments))
        else:
            result.calls[e.index].arguments += e.arguments
    return result


def parse(
    parser: ToolParser, text: str, names: set[str] | None = None, max_calls: int | None = None
) -> ParsedOutput:
    stream = ToolCallStream(parser, names, max_calls)
    return collect(stream.push(text) + stream.flush())
