"""Speculative decoding for hybrid models: per-position recurrent states of a verify step.

A verify row feeds a sequence's last token and k drafts; the recurrent layers (Gated DeltaNet, Mamba-2,
short conv) move the sequence's state slot through all k + 1 positions. When only a < k drafts are kept,
the state must be the one after the last token and those a drafts, which the live row no longer holds
(a recurrent state cannot be rolled back). So in a verify step each stateful layer also writes its state
after each of the first k positions into *spec rows*: scratch rows of the same state pool, after the
running slots and the prefix checkpoints. `BatchInputs.state_keep` names, per token, the row that receives
the state after it (-1: none; the last position's state is the live row's own).

After acceptance the engine asks for one copy, spec row [a] -> the live row, at the start of the next
step's copies (before any checkpoint save reads the live row, and before the next forward writes the spec
rows again); nothing when every draft was kept. The spec rows are therefore only held from a step's
forward to the next step's copies: each step hands all of them out afresh, and a finished, aborted or
preempted sequence leaves nothing behind but a copy into a row that is zeroed or restored before use.

When a verify step's kept tokens pass a block boundary, the state at that boundary is in a spec row too:
the sequence's own decode checkpoint (hybrid_prefix.py) moves there at the next step, as it would have
in a plain decode step landing on it, once that block is named.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from localchat.engine.interface import BatchInputs, ModelRunner, SchedulerOutput, StateCacheSpec
from localchat.engine.request import Request
from localchat.engine.speculative import DEFAULT_MAX_BATCH

if TYPE_CHECKING:
    from localchat.engine.config import EngineConfig
    from localchat.engine.scheduler import Scheduler
    from localchat.engine.speculative import Proposer

log = logging.getLogger(__name__)

# Spec rows take at most this share of the state budget (before the checkpoints and running slots).
SPEC_ROWS_SHARE = 4


def spec_rows_wanted(
    method: str, num_tokens: int, max_num_seqs: int, max_batch: int = DEFAULT_MAX_BATCH
) -> int:
    """Spec rows for every draft of every sequence that may speculate at once (max_batch, or fewer when
    fewer run, x k); 0 when speculation is off. `auto` counts as on (it may pick n-gram): the RAM estimate
    (models/memory.py) counts them before the method is resolved."""
    return 0 if method == "off" else min(max_batch, max_num_seqs) * num_tokens


def plan_spec_rows(config: EngineConfig, budget: int, bytes_per_slot: int) -> int:
    """How many spec rows a hybrid model gets: `spec_rows_wanted`, capped by a quarter of the budget."""
    spec = config.speculative
    if not spec.enabled:
        return 0
    wanted = spec_rows_wanted(spec.method, spec.num_tokens, config.max_num_seqs, spec.max_batch)
    return max(0, min(wanted, budget // SPEC_ROWS_SHARE // bytes_per_slot))


class SpecStateRows:
    """The spec rows [first, first + count) of the state pool, handed out per step."""

    def __init__(self, first: int, count: int, block_size: int) -> None:
        assert count >= 1
        self.first, self.count, self.block_size = first, count, block_size
        self.assigned: dict[str, list[int]] = {}  # this step's spec rows per verifying sequence
        self._next = 0
        self.copies: list[tuple[int, int]] = []  # fix-ups for the next step: (spec row, live row)
        # request -> (tokens, spec row): the state at the latest block boundary its kept tokens passed
        self.boundaries: dict[str, tuple[int, int]] = {}
        self.fixups_total = 0

    def begin_step(self) -> None:
        self.assigned = {}
        self._next = 0

    @property
    def available(self) -> int:
        return self.count - self._next

    def assign(self, req_id: str, num_drafts: int) -> None:
        """`num_drafts` (<= available) rows for the states after the last token and drafts 1 .. k - 1."""
        rows = list(range(self.first + self._next, self.first + self._next + num_drafts))
        self._next += num_drafts
        self.assigned[req_id] = rows

    def keep_array(self, batch: BatchInputs) -> np.ndarray | None:
        """BatchInputs.state_keep: per token, the spec row that receives the state after it (-1: none)."""
        if not self.assigned:
            return None
        keep = np.full(batch.num_tokens, -1, dtype=np.int64)
        for row, req_id in enumerate(batch.req_ids):
            rows = self.assigned.get(req_id)
            if rows:  # a verify row is the last token + len(rows) drafts: keep all but the last position
                end = int(batch.query_start_loc[row + 1])
                keep[end - len(rows) - 1 : end - 1] = rows
        return keep

    def accepted(self, request: Request, live_row: int | None, num_drafts: int, num_kept: int) -> None:
        """After a verify step that kept `num_kept` of `num_drafts` drafts (`request.num_computed_tokens`
        already counts them): restore the state of exactly the kept tokens, and note a block boundary
        they passed."""
        rows = self.assigned.get(request.req_id)
        if not rows or live_row is None:
            return
        if num_kept < num_drafts:
            self.copies.append((rows[num_kept], live_row))
            self.fixups_total += 1
        done = request.num_computed_tokens  # the last token and the kept drafts are in the state
        first = done - num_kept - 1  # tokens in the state before this step
        boundary = (done - 1) // self.block_size * self.block_size  # the latest one below `done`
        if boundary > first:  # state after `boundary` tokens: after position boundary - first - 1
            self.boundaries[request.req_id] = (boundary, rows[boundary - first - 1])
        else:
            self.boundaries.pop(request.req_id, None)

    def end_step(self, step_runs: bool) -> list[tuple[int, int]]:
        """The fix-ups for this step's copies (kept for the next when the step is empty). Boundaries not
        saved while scheduling it are dropped: its forward may overwrite their spec rows."""
        self.boundaries.clear()
        if not step_runs:
            return []
        copies, self.copies = self.copies, []
        return copies


def copied_back_outside(scheduler: Scheduler, output: SchedulerOutput) -> list[Request]:
    """The running sequences a failed step did not include whose live row it was to copy into (a copy back
    queued by their last verify step): the copy may never have run, so their state may still hold the
    rejected drafts, and the spec rows are overwritten later. They fail with the step."""
    pool = scheduler.state_pool
    if scheduler.spec_rows is None or pool is None:
        return []
    rows = {dst for _, dst in output.state_copies}
    requests, scheduled = scheduler.requests, output.num_scheduled_tokens
    return [
        requests[r] for r, row in pool.slots.items() if row in rows and r not in scheduled and r in requests
    ]


def save_passed_boundary(scheduler: Scheduler, request: Request) -> None:
    """Move the sequence's decode checkpoint to the block boundary its last verify step passed (its
    state there is still in that step's spec row: nothing writes spec rows before the next forward).
    Called while the sequence is scheduled, after its blocks are named."""
    spec_rows, checkpoints = scheduler.spec_rows, scheduler.checkpoints
    if spec_rows is None or (found := spec_rows.boundaries.pop(request.req_id, None)) is None:
        return
    boundary, row = found
    index = boundary // spec_rows.block_size - 1
    if checkpoints is None or boundary < request.num_prompt_tokens or index >= len(request.block_hashes):
        return
    checkpoints.save(request.block_hashes[index], boundary, row, owner=request.req_id)


def speculation_note(
    config: EngineConfig,
    runner: ModelRunner,
    state_spec: StateCacheSpec | None,
    draft_runner: ModelRunner | None,
    proposer: Proposer | None,
    spec_rows: int,
) -> str:
    """Why speculation cannot run with this model and runner ("" when it can or was not asked for)."""
    spec = config.speculative
    if not spec.enabled:
        return ""
    if spec.method == "draft" and draft_runner is None:
        return "--speculative draft needs a draft model (--draft-model, or a models.yaml entry's draft)"
    if spec.method == "eagle" and proposer is None:
        return "--speculative eagle needs an EAGLE-3 head (--draft-model FOLDER) on the torch backend"
    if spec.method == "mtp" and proposer is None:
        return "--speculative mtp needs the model's multi-token-prediction head (torch backend)"
    if not getattr(runner, "supports_speculation", True):
        return f"the {type(runner).__name__} runner cannot score draft tokens"
    if state_spec is None:
        return ""
    if spec.method == "eagle" and getattr(runner, "hidden_taps", None) is None:
        return "EAGLE-3 on this hybrid model: its layers run in their own loop and hand out no hidden states"
    if not getattr(runner, "hybrid_speculation", False):
        return (
            f"the {type(runner).__name__} runner does not write the per-position recurrent states a hybrid "
            "model's verify step needs (its state could not be rolled back past rejected drafts)"
        )
    if getattr(runner, "steps_in_flight", 1) != 1:
        return "hybrid model with steps in flight (--pp): the spec rows' copies are not ordered across stages"
    if spec_rows < 1:
        return (
            "hybrid model: the memory budget holds no spec row for per-position states (raise --kv-cache-mib)"
        )
    return ""


def start_spec_rows(scheduler: Scheduler, first: int, count: int, spec: StateCacheSpec | None) -> None:
    """Hand the scheduler its spec rows and log what speculation on this hybrid model can do."""
    assert spec is not None
    config = scheduler.config.speculative
    scheduler.spec_rows = SpecStateRows(first, count, scheduler.block_size)
    wanted = spec_rows_wanted(
        config.method, config.num_tokens, scheduler.config.max_num_seqs, config.max_batch
    )
    log.info(
        "Speculation on a hybrid model: %d spec rows of %.2f MiB (%.0f MiB) for per-position states%s",
        count,
        spec.bytes_per_slot / 2**20,
        count * spec.bytes_per_slot / 2**20,
        ""
        if count >= wanted
        else f"; drafts per step capped at {count} (max_batch {config.max_batch} x k {config.num_tokens}"
        f" = {wanted} would not fit in a quarter of the budget)",
    )
