"""Splits `<think>…</think>` out of generated text, incrementally: tags may arrive cut across
deltas, so a tail that could start a tag is held back until the next delta decides it.

Invariant: for any way of cutting a text into deltas, the concatenated outputs of `push` + `flush`
equal one `push(text)` + `flush()`, so streamed and non-streamed responses agree.
"""

from __future__ import annotations

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


def starts_in_reasoning(prompt_text: str) -> bool:
    """Templates of reasoning models often end the prompt with an opened `<think>` (DeepSeek-R1)."""
    return prompt_text.rfind(OPEN_TAG) > prompt_text.rfind(CLOSE_TAG)


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    # Such a suffix starts with the tag's "<": without one in the last len(tag) - 1 characters (nearly
    # every streamed delta) there is none, found in one search instead of len(tag) - 1 slices (#34).
    if text.find(tag[0], max(0, len(text) - len(tag) + 1)) < 0:
        return 0
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningSplitter:
    def __init__(self, in_reasoning: bool = False) -> None:
        self.in_reasoning = in_reasoning
        self._held = ""
        self._strip_content = False  # whitespace right after </think> is separator, not content

    def push(self, text: str) -> tuple[str, str]:
        """Return (reasoning, content) that is safe to emit after `text`."""
        if not self._held and "<" not in text:  # no tag, no part of one (most deltas): the loop's answer
            if self.in_reasoning:
                return text, ""
            if not self._strip_content:
                return "", text
        buf, self._held = self._held + text, ""
        reasoning: list[str] = []
        content: list[str] = []
        while buf:
            tag = CLOSE_TAG if self.in_reasoning else OPEN_TAG
            at = buf.find(tag)
            if at < 0:
                keep = _partial_tag_len(buf, tag)
                self._emit(buf[: len(buf) - keep], reasoning, content)
                self._held = buf[len(buf) - keep :]
                break
            self._emit(buf[:at], reasoning, content)
            buf = buf[at + len(tag) :]
            self.in_reasoning = not self.in_reasoning
            self._strip_content = not self.in_reasoning
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        self._emit(self._held, reasoning, content)
        self._held = ""
        return "".join(reasoning), "".join(content)

    def _emit(self, piece: str, reasoning: list[str], content: list[str]) -> None:
        if self.in_reasoning:
            reasoning.append(piece)
            return
        if self._strip_content:
            piece = piece.lstrip()
            self._strip_content = not piece
        content.append(piece)


def split_reasoning(text: str, in_reasoning: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(in_reasoning)
    r1, c1 = splitter.push(text)
    r2, c2 = splitter.flush()
    return r1 + r2, c1 + c2
