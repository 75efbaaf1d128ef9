"""Micro-batches for pipeline stages: a large step cut into groups of whole rows (requests), run through
the stages one after another, so stage s works on group i while stage s + 1 works on group i - 1.

Rows are independent (each has its own K/V blocks, state slot, positions and pictures), so a group
is the step's own data sliced, and the logits of the groups, in order, are the step's. Only steps
with many tokens are cut: a decode step reads every weight once per group, so cutting it would cost
more than the overlap saves; a prefill is compute-bound and gains. (Decode steps overlap another
way: several steps in flight, each of its own requests: engine/in_flight.py.) Every rank cuts the
same step the same way (a pure function of the step), so the sends and receives pair up.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from localchat.engine.interface import BatchInputs

MICRO_BATCH_TOKENS = 256  # the fewest tokens a group may have; fewer and the step stays whole


def micro_batches(batch: BatchInputs, groups: int, min_tokens: int = MICRO_BATCH_TOKENS) -> list[BatchInputs]:
    """`batch` cut into at most `groups` runs of whole rows of about equal token counts, each of at
    least `min_tokens` tokens; [batch] when it cannot be cut (one row, too few tokens, or logits
    rows out of token order)."""
    qsl = batch.query_start_loc
    total = batch.num_tokens
    groups = min(groups, batch.num_reqs, total // max(min_tokens, 1))
    indices = batch.logits_indices
    if groups < 2 or (len(indices) > 1 and bool((np.diff(indices) < 0).any())):
        return [batch]
    # Cut before the row whose start is nearest each k/groups share of the tokens.
    cuts = sorted({int(np.abs(qsl[1:-1] - total * k / groups).argmin()) + 1 for k in range(1, groups)})
    bounds = [0, *cuts, batch.num_reqs]
    parts = [_rows(batch, r0, r1) for r0, r1 in itertools.pairwise(bounds)]
    if min(p.num_tokens for p in parts) < min_tokens:
        return [batch]
    # The step's K/V and state copies run once, with the first group: before any group writes (a source
    # block or state slot may be handed out to another row of the same step).
    return [replace(p, kv_copies=[], state_copies=[]) if i else p for i, p in enumerate(parts)]


def _rows(batch: BatchInputs, r0: int, r1: int) -> BatchInputs:
    """Rows r0 .. r1 - 1 of `batch` as a batch of their own (token indices rebased to 0)."""
    qsl = batch.query_start_loc
    t0, t1 = int(qsl[r0]), int(qsl[r1])
    keep = (batch.logits_indices >= t0) & (batch.logits_indices < t1)
    seq_lens = batch.seq_lens[r0:r1]
    return replace(
        batch,
        req_ids=batch.req_ids[r0:r1],
        input_ids=batch.input_ids[t0:t1],
        positions=batch.positions[t0:t1],
        slot_mapping=batch.slot_mapping[t0:t1],
        query_start_loc=qsl[r0 : r1 + 1] - t0,
        seq_lens=seq_lens,
        block_tables=batch.block_tables[r0:r1],
        logits_indices=batch.logits_indices[keep] - t0,
        sample_req_ids=[r for r, k in zip(batch.sample_req_ids, keep, strict=True) if k],
        max_query_len=int(np.diff(qsl[r0 : r1 + 1]).max()),
        max_seq_len=int(seq_lens.max()),
        sampling=None,  # sampling reads the whole step's logits, after every group ran
        state_slots=None if batch.state_slots is None else batch.state_slots[r0:r1],
        state_keep=None if batch.state_keep is None else batch.state_keep[t0:t1],  # (spec rows per token)
        image_slices=[
            replace(s, token_rows=[t - t0 for t in s.token_rows])
            for s in batch.image_slices
            if t0 <= s.token_rows[0] < t1
        ],
        rope_positions=None if batch.rope_positions is None else batch.rope_positions[:, t0:t1],
    )
