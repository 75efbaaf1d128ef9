"""Incremental detokenizer with stop strings.

Invariants: the concatenated deltas equal `decode(output ids)` (cut at a stop string when one matched);
no delta ends in a partial UTF-8 character; text that may be the start of a stop string is held back
until it is known not to be.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decoder,
        *,
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop or []
        self.skip_special_tokens = skip_special_tokens
        self.include_stop = include_stop_str_in_output
        self.ids: list[int] = []
        # Decode windows: text of ids[prefix_offset:read_offset] was already turned into output.
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all decoded text so far (before any stop cut)
        self.emitted = 0  # characters of `text` handed out
        self.stop_hit: str | None = None

    def push(self, token_ids: list[int]) -> str:
        """Add new tokens; return the text that is now safe to show."""
        if self.stop_hit is not None:
            return ""
        self.ids.extend(token_ids)
        self.text += self._decode_new()
        if self.stop:
            return self._emit_with_stops()
        return self._take(len(self.text))

    def flush(self) -> str:
        """At the end of generation: release text held back for a stop string that never came."""
        if self.stop_hit is not None:
            return ""
        tail = self.tokenizer.decode(self.ids[self.prefix_offset :], self.skip_special_tokens)
        head = self.tokenizer.decode(
            self.ids[self.prefix_offset : self.read_offset], self.skip_special_tokens
        )
        if len(self.ids) > self.read_offset and tail.startswith(head):
            self.text += tail[len(head) :]  # trailing partial character, shown as U+FFFD as decode() does
            self.read_offset = len(self.ids)
        return self._take(len(self.text))

    def _decode_new(self) -> str:
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], self.skip_special_tokens)
        full = decode(self.ids[self.prefix_offset :], self.skip_special_tokens)
        if full.endswith(REPLACEMENT_CHAR) or not full.startswith(prefix):
            # An unfinished multi-byte character (or a merge not yet settled): wait for more tokens.
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return full[len(prefix) :]

    def _emit_with_stops(self) -> str:
        longest = max(len(s) for s in self.stop)
        search_from = max(0, self.emitted - longest + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            at = self.text.find(s, search_from)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            at, s = best
            delta = self._take(at + len(s) if self.include_stop else at)
            self.stop_hit = s
            return delta
        return self._take(len(self.text) - self._held_back())

    def _held_back(self) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return min(hold, len(self.text) - self.emitted)

    def _take(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        delta = self.text[self.emitted : upto]
        self.emitted = upto
        return delta
