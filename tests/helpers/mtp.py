"""Shared pieces of the MTP speculative-decoding tests (torch, MLX, GGUF, GLM): a spy that records every
draft an MTP proposer makes, with the sequence it was made for, so a test can replay each draft through
its plain reference head; and the prefix-caching agent-wave check both backends run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Draft = tuple[list[int], int, int, list[int]]


def record_drafts(proposer: Any, extra: Callable[[Any, str], Any] | None = None) -> list[tuple[Any, ...]]:
    """Every non-empty draft `proposer` makes from now on: (all tokens, computed tokens, k, draft), plus
    `extra(proposer, req_id)` when given (read right after the draft, while the head's state is current)."""
    seen: list[tuple[Any, ...]] = []
    propose = proposer.propose

    def spy(wanted: Any, live: set[str]) -> dict[str, list[int]]:
        drafts = propose(wanted, live)
        for request, k in wanted:
            if drafts.get(request.req_id):
                row: tuple[Any, ...] = (
                    list(request.all_token_ids),
                    request.num_computed_tokens,
                    k,
                    drafts[request.req_id],
                )
                if extra is not None:
                    row += (extra(proposer, request.req_id),)
                seen.append(row)
        return drafts

    proposer.propose = spy
    return seen


def recorded(proposer: Any) -> list[Draft]:
    """Every non-empty draft the proposer makes from now on, with the sequence it was made for."""
    return record_drafts(proposer)


def last_logits(proposer: Any, req_id: str) -> Any:
    """The head's logits for the last position it drafted from for `req_id` (a backend array)."""
    state = proposer.states[req_id]
    return proposer.head.logits(state.last[1][None])[0]
