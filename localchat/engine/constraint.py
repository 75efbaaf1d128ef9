"""What the engine needs from a grammar (structured output, forced tool calls), without knowing which
grammar library compiled it: a shareable compiled `Constraint` and one `TokenMatcher` per request.

Bitmask layout (shared with the samplers): row r, word w, bit b (little-endian) set = token `32 * w + b`
may be sampled. Tokens past the mask's width are banned; all bits set (-1) = unconstrained row.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class TokenMatcher(Protocol):
    """One request's position in its grammar. The engine advances it by every token it accepts."""

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 [rows, words])."""
        ...

    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token; False when the grammar rejects it."""
        ...

    @property
    def is_finished(self) -> bool:
        """The grammar is complete (and its end-of-sequence consumed): the request must stop."""
        ...

    @property
    def error(self) -> str | None: ...


class Constraint(Protocol):
    """A compiled grammar, shared by the n choices of one API call."""

    @property
    def mask_words(self) -> int:
        """int32 words per bitmask row: ceil(model vocab / 32)."""
        ...

    def new_matcher(self) -> TokenMatcher: ...


def new_bitmask(rows: int, words: int) -> np.ndarray:
    """All tokens allowed in every row."""
    return np.full((rows, words), -1, dtype=np.int32)


def constrained_rows(bitmask: np.ndarray | None) -> np.ndarray:
    """int64 indices of the rows that forbid something (unconstrained rows are all ones)."""
    if bitmask is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero((bitmask != -1).any(axis=1))


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """int32 [rows, words] -> bool [rows, vocab_size]: the one unpacking both samplers use."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little").view(bool)
    if bits.shape[1] >= vocab_size:
        return bits[:, :vocab_size]
    allowed = np.zeros((bitmask.shape[0], vocab_size), dtype=bool)  # ids past the mask: never allowed
    allowed[:, : bits.shape[1]] = bits
    return allowed


def fill_batch_bitmask(sampled: list[tuple[TokenMatcher, int]], num_rows: int, words: int) -> np.ndarray:
    """One step's bitmask: each constrained row from its matcher, every other row all-allowed."""
    bitmask = new_bitmask(num_rows, words)
    for matcher, row in sampled:
        matcher.fill_bitmask(bitmask, row)
    return bitmask
