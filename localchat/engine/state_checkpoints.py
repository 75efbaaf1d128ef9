"""Recurrent-state checkpoints at block boundaries: prefix caching for hybrid models.

Cached K/V blocks alone cannot resume a hybrid model (engine/state_slots.py): its recurrent layers also
need their state after the reused tokens. A checkpoint is a copy of a sequence's state slot taken when
it had processed exactly a whole number of blocks, kept in one of `num_slots` extra rows of the same
state pool (rows [first_slot, first_slot + num_slots), after the running sequences' rows), and named by
the chained hash of the block it ends with (block_manager.py), so it stands for that whole prefix.

Saves and restores are slot-to-slot copies (`copies`: (source row, destination row)) that the runner
applies in order, one after the other, before the step's forward: a save reads a running row's state
as the previous step left it, a restore writes a newly admitted row before that row's first forward
(which does not zero it: the row starts past position 0). In-order application keeps this index and
the rows in step even when one step saves into a row and restores from it.

Two kinds: an unowned checkpoint (at a prompt's last whole-block boundary: regenerate / edit the last
message) joins the LRU list at once; a running sequence's decode checkpoint is owned, moved forward in
place at each boundary its processed tokens reach (the next turn of a chat starts with this
conversation), never evicted while owned, and joins the LRU list when the sequence ends. A checkpoint
whose block left the prefix cache is useless and goes first when a row is needed; then a prompt's
boundary checkpoint its chat's next turn went past, then chats', and last those where prompts part (a
shared system prompt, tool schemas), which serve every new chat that starts with them (`_take`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Shared-prefix checkpoints are evicted after chats' while they hold at most 1/SHARED_SHARE of the rows
# (beyond that they rank with chats'): enough for a system prompt and a few tool sets, and never all
# of the rows the next turns of the chats running now need.
SHARED_SHARE = 2


@dataclass(slots=True)
class Checkpoint:
    slot: int
    num_tokens: int  # tokens the state has processed (a multiple of the block size)
    owner: str | None = None  # the running request that moves it forward, if any
    boundary: bool = False  # at a prompt's last whole block: a regenerated answer / edited last message
    passed: bool = False  # a longer prompt through it restored further on: the chat went on
    shared: bool = False  # where prompts part (a system prompt, tool schemas): the last to go


class StateCheckpoints:
    def __init__(self, first_slot: int, num_slots: int, is_cached: Callable[[int], bool]) -> None:
        assert num_slots >= 1
        self.first_slot = first_slot
        self.num_slots = num_slots
        self._is_cached = is_cached  # whether a block hash is still in the prefix cache
        self._free = list(range(first_slot + num_slots - 1, first_slot - 1, -1))
        self._index: OrderedDict[int, Checkpoint] = OrderedDict()  # block hash -> checkpoint, LRU first
        self._owned: dict[str, int] = {}  # request -> the block hash its decode checkpoint is named by
        self.copies: list[tuple[int, int]] = []  # this step's (source row, destination row), in order
        # Running request -> the boundaries (tokens, ascending) where its prompt leaves prefixes whose K/V
        # are cached without a state: its prefill stops and saves there (hybrid_prefix.note_shared_boundary).
        self.shared_cuts: dict[str, tuple[int, ...]] = {}
        self.saves_total = 0
        self.restores_total = 0

    @property
    def num_used(self) -> int:
        return len(self._index)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._index

    def longest(self, hashes: list[int], block_size: int) -> int:
        """How many of a prompt's leading cached blocks (their chained hashes, in order) end at a
        checkpoint: the most that may be reused with the state (0: none)."""
        for count in range(len(hashes), 0, -1):
            found = self._index.get(hashes[count - 1])
            if found is not None and found.num_tokens == count * block_size:
                for shorter in hashes[: count - 1]:  # (a next turn passes its last turn's prompt boundary)
                    if (before := self._index.get(shorter)) is not None and before.boundary:
                        before.passed = True
                return count
        return 0

    def restore(self, block_hash: int, slot: int) -> None:
        """Copy the checkpoint named `block_hash` into running row `slot` (before this step's forward)."""
        found = self._index[block_hash]
        self._index.move_to_end(block_hash)
        self.copies.append((found.slot, slot))
        self.restores_total += 1

    def save(
        self,
        block_hash: int,
        num_tokens: int,
        slot: int,
        owner: str | None = None,
        boundary: bool = False,
        shared: bool = False,
    ) -> None:
        """Checkpoint running row `slot`, which has processed `num_tokens` tokens ending with the block
        named `block_hash`. With `owner`, that request's own checkpoint moves here (taking a row the
        first time); without, a new unowned one, at a prompt's `boundary` or `shared` (where prompts
        part), which ranks it for eviction (`_take`). Nothing is saved when no row can be had."""
        if block_hash in self._index:
            self._index.move_to_end(block_hash)  # the same prefix gives the same state: keep the one there
            self._index[block_hash].shared |= shared
            return
        previous = self._owned.get(owner) if owner is not None else None
        if previous is not None:
            row: int | None = self._index.pop(previous).slot
        elif owner is not None and len(self._owned) >= max(1, self.num_slots - 1):
            return  # sequences may not own every row: a prompt's checkpoint must find one too
        else:
            row = self._take()
        if row is None:
            return
        self._index[block_hash] = Checkpoint(row, num_tokens, owner, boundary, shared=shared)
        if owner is not None:
            self._owned[owner] = block_hash
        self.copies.append((slot, row))
        self.saves_total += 1

    def release(self, owner: str) -> None:
        """`owner` stopped running (finished or preempted): its checkpoint joins the LRU list."""
        self.shared_cuts.pop(owner, None)  # (re-admission looks at the cache again)
        block_hash = self._owned.pop(owner, None)
        if block_hash is not None:
            found = self._index[block_hash]
            found.owner = None
            self._index.move_to_end(block_hash)

    def forget_rows(self, rows: set[int]) -> None:
        """A step failed: its saves into `rows` may never have run; drop those checkpoints."""
        for block_hash, found in list(self._index.items()):
            if found.slot in rows:
                self._drop(block_hash)

    def end_step(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def _take(self) -> int | None:
        """A free row: a never-used or dropped one, else that of an unowned checkpoint, the least recently
        used first of, in turn: those whose blocks left the prefix cache (useless now), prompt boundaries
        a later turn of their chat went past, chats' (a decode checkpoint: the next turn; a prompt
        boundary: a regenerated answer), shared prefixes' (while they hold at most 1/SHARED_SHARE of the
        rows). None when every row is owned.

        A shared prefix serves every new chat that starts with it, a chat's checkpoint only that chat's
        next turn or regenerated answer: under plain LRU the agents' own turns pushed their system prompt
        out between waves of new chats (on the fake runner's agent workloads that took 2-3x the prefill
        tokens: docs/hybrid.md, benchmarks/hybrid_prefix_agents.py)."""
        if self._free:
            return self._free.pop()
        unowned = [h for h, c in self._index.items() if c.owner is None]
        if not unowned:
            return None
        protected = sum(self._index[h].shared for h in unowned) <= self.num_slots // SHARED_SHARE

        def rank(block_hash: int) -> int:
            found = self._index[block_hash]
            if not self._is_cached(block_hash):
                return 0
            if found.shared:
                return 3 if protected else 2
            return 1 if found.passed else 2

        self._drop(min(unowned, key=rank))  # (min keeps the first of a rank: the least recently used)
        return self._free.pop()

    def _drop(self, block_hash: int) -> None:
        found = self._index.pop(block_hash)
        if found.owner is not None:
            del self._owned[found.owner]
        self._free.append(found.slot)


def checkpoint_stats(checkpoints: StateCheckpoints | None) -> dict[str, int]:
    """EngineStats' checkpoint fields (zeros without checkpoints)."""
    if checkpoints is None:
        return {}
    return {
        "state_checkpoints_used": checkpoints.num_used,
        "state_checkpoints_total": checkpoints.num_slots,
        "state_checkpoint_saves_total": checkpoints.saves_total,
        "state_checkpoint_restores_total": checkpoints.restores_total,
    }
