"""Splits gpt-oss's harmony-format output into reasoning and content, incrementally.

After a prompt ending in `<|start|>assistant`, gpt-oss writes messages such as
`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`.
The `analysis` channel is reasoning; `final` (and `commentary`, the tool-call preamble) is content;
headers and markers are dropped. Same interface and streaming invariant as reasoning.ReasoningSplitter:
a tail that could begin a marker is held back until the next delta decides it. The text must keep its
special tokens (decoded with skip_special_tokens off), since the markers are special tokens.
"""

from __future__ import annotations

_ENDS = ("<|end|>", "<|return|>", "<|call|>")  # close a message body
_HEADERS = ("<|start|>", "<|channel|>", "<|constrain|>")  # open or continue a header
_MESSAGE = "<|message|>"  # ends the header, starts the body
MARKERS = (*_ENDS, *_HEADERS, _MESSAGE)
REASONING_CHANNEL = "analysis"


class HarmonySplitter:
    def __init__(self) -> None:
        self._held = ""
        self._in_body = True  # text before any header counts as the final answer
        self._channel = "final"
        self._header = ""  # the text after the last <|channel|> of the header being read

    def push(self, text: str) -> tuple[str, str]:
        """Return (reasoning, content) that is safe to emit after `text`."""
        buf, self._held = self._held + text, ""
        reasoning: list[str] = []
        content: list[str] = []
        while buf:
            at = buf.find("<|")
            if at < 0:
                keep = 1 if buf.endswith("<") else 0  # may become "<|" with the next delta
                self._emit(buf[: len(buf) - keep], reasoning, content)
                self._held = buf[len(buf) - keep :]
                break
            self._emit(buf[:at], reasoning, content)
            buf = buf[at:]
            marker = next((m for m in MARKERS if buf.startswith(m)), None)
            if marker is None:
                if any(m.startswith(buf) for m in MARKERS):  # a marker cut at the delta's end
                    self._held = buf
                    break
                self._emit("<|", reasoning, content)  # not a marker: plain text
                buf = buf[2:]
                continue
            self._marker(marker)
            buf = buf[len(marker) :]
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        self._emit(self._held, reasoning, content)
        self._held = ""
        return "".join(reasoning), "".join(content)

    def _marker(self, marker: str) -> None:
        if marker in _ENDS or marker == "<|channel|>":
            self._in_body, self._header = False, ""
        elif marker == _MESSAGE:
            words = self._header.split()
            self._channel = words[0] if words else "final"
            self._in_body = True
        else:  # <|start|> begins a new header; <|constrain|> ends the channel name
            if marker == "<|start|>":
                self._header = ""
            self._in_body = False
            self._header += " "

    def _emit(self, piece: str, reasoning: list[str], content: list[str]) -> None:
        if not piece:
            return
        if not self._in_body:
            self._header += piece
        elif self._channel == REASONING_CHANNEL:
            reasoning.append(piece)
        else:
            content.append(piece)


def split_harmony(text: str) -> tuple[str, str]:
    splitter = HarmonySplitter()
    r1, c1 = splitter.push(text)
    r2, c2 = splitter.flush()
    return r1 + r2, c1 + c2
