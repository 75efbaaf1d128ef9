"""A hybrid draft model's recurrent states (draft_model.py): Qwen3.5 comes only as hybrids, so its 0.8B is
the natural draft for its larger sizes.

The draft proposer rolls a shadow back to the drafts the target kept by lowering its computed count: the
K/V of the rejected drafts is simply overwritten later. A recurrent state cannot be lowered: it has moved
through every draft fed. But the draft feeds its drafts one token per pass, so before each such pass the
state the shadow has so far is copied aside (a state copy, applied by the runner before the forward):
after the round, snapshot j holds the state after the committed tokens and the first j drafts, and the
live row the state after all of them. When the target kept a of them, the next round starts with one
copy, snapshot [a] -> the live row, first among that pass's copies (nothing when the state is already
right). A state the snapshots do not hold (the target committed nothing new: its last token is fed
again) sends the shadow back to position 0, which the runner starts from a zeroed state: exact, at the
cost of a prefill.

Rows: `num_seqs` live rows (one per shadow that may draft at once), then `snapshots` rows per live row
(k - 1: the drafts fed in a round). The draft's prefix cache is not used for a hybrid draft (its blocks
would need the state at that point too, and the draft keeps no checkpoints): a new shadow prefills its
whole prompt.
"""

from __future__ import annotations

import logging

from localchat.engine.interface import ModelRunner, StateCacheSpec

log = logging.getLogger("localchat.engine.engine")


class DraftStates:
    """The draft runner's state rows and, per shadow, which token count each row holds."""

    def __init__(self, runner: ModelRunner, spec: StateCacheSpec, num_seqs: int, snapshots: int) -> None:
        self.num_seqs, self.snapshots = max(1, num_seqs), max(0, snapshots)
        rows = self.num_seqs * (1 + self.snapshots)
        runner.initialize_state_cache(rows)  # type: ignore[attr-defined]
        log.info(
            "Hybrid draft model: %d state rows of %.2f MiB (%.0f MiB): %d shadows + %d snapshots each",
            rows,
            spec.bytes_per_slot / 2**20,
            rows * spec.bytes_per_slot / 2**20,
            self.num_seqs,
            self.snapshots,
        )
        self._free = list(range(self.num_seqs - 1, -1, -1))
        self.slots: dict[str, int] = {}  # shadow -> its live row
        self.tokens: dict[str, int] = {}  # shadow -> tokens its live row's state has processed
        self._taken: dict[str, dict[int, int]] = {}  # shadow -> {tokens: snapshot row} this round
        self.copies: list[tuple[int, int]] = []  # for the next pass: (source row, destination row)
        self.restores_total = 0  # rounds that started from a snapshot (drafts rejected part-way)

    def allocate(self, req_id: str) -> bool:
        """A live row for the shadow (its own if it has one); False when every row is taken."""
        if req_id in self.slots:
            return True
        if not self._free:
            return False
        self.slots[req_id] = self._free.pop()
        self.tokens[req_id] = 0
        self._taken[req_id] = {}
        return True

    def free(self, req_id: str) -> None:
        slot = self.slots.pop(req_id, None)
        if slot is None:
            return
        self._free.append(slot)
        self._free.sort(reverse=True)
        del self.tokens[req_id], self._taken[req_id]
        # A copy still queued for that row would land on whoever takes it next, before its first forward
        # zeroes it; dropped anyway so that nothing depends on the order.
        self.copies = [(src, dst) for src, dst in self.copies if dst != slot]

    def rewind(self, req_id: str, tokens: int) -> int:
        """Make the live row's state the one after `tokens` tokens: a queued copy from this round's
        snapshot when needed. Returns `tokens`, or 0 when no row holds that state (prefill again).
        Starts a new round: the snapshots are free to be taken again."""
        taken, self._taken[req_id] = self._taken[req_id], {}
        if tokens == self.tokens[req_id]:
            return tokens
        row = taken.get(tokens)
        if row is None:
            self.tokens[req_id] = 0
            return 0
        self.copies.append((row, self.slots[req_id]))
        self.tokens[req_id] = tokens
        self.restores_total += 1
        return tokens

    def snapshot(self, req_id: str) -> None:
        """Before a one-token pass that feeds a draft: copy the state so far aside (once per count)."""
        taken = self._taken[req_id]
        tokens = self.tokens[req_id]
        if tokens in taken or len(taken) >= self.snapshots:
            return
        slot = self.slots[req_id]
        row = self.num_seqs + slot * self.snapshots + len(taken)
        taken[tokens] = row
        self.copies.append((slot, row))

    def advance(self, req_id: str, count: int) -> None:
        """The shadow's row went through `count` more tokens (its pass ran)."""
        self.tokens[req_id] += count

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies
