"""Stop an answer that has fallen into a loop: the same short run of tokens, over and over.

Small models at a high temperature can lock into one glyph or one sentence and repeat it until
max_tokens, which on a CPU means minutes of garbage. A loop here is the last `window` output tokens
being periodic (token i equals token i - p for every i in the window) with a period p of at most a
quarter of the window, so it has repeated at least four times. Normal text, lists and code never hold
one period for hundreds of tokens; a request that really wants repetition sets ignore_eos (or the server
runs with --loop-stop 0).
"""

from __future__ import annotations

from collections.abc import Sequence

# The reason a loop stop reports next to finish_reason "length" (the API's stop_reason extension).
LOOP_STOP_REASON = "repetition"
# What the web UI and the terminal chat show under an answer cut short this way.
LOOP_NOTE = "\n\n[Stopped: the answer kept repeating itself.]"
# How often the tail is examined: a loop is caught at most this many tokens late, at 1/16 of the cost.
CHECK_EVERY = 16


def is_looping(output_token_ids: Sequence[int], window: int) -> bool:
    """Whether the last `window` tokens repeat one period of at most window // 4 tokens. Checked only
    every CHECK_EVERY tokens (callers ask after each token)."""
    n = len(output_token_ids)
    if window <= 0 or n < window or n % CHECK_EVERY:
        return False
    tail = list(output_token_ids[n - window :])
    last = tail[-1]
    for period in range(1, window // 4 + 1):
        # Cheap filter first: the period must at least map the last token onto an equal one.
        if tail[-1 - period] == last and tail[period:] == tail[:-period]:
            return True
    return False
