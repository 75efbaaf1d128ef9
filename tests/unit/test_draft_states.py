"""engine/draft_states.py: the hybrid draft's state rows (live rows, then k - 1 snapshot rows each), the
copies a round queues, and the fallback to position 0. End to end on real layers:
tests/backends/test_hybrid_draft_torch.py."""

from __future__ import annotations

from localchat.backends.fake import FakeRunner
from localchat.engine.draft_states import DraftStates


def states(num_seqs: int = 2, snapshots: int = 3) -> tuple[FakeRunner, DraftStates]:
    runner = FakeRunner(state_bytes=64)
    return runner, DraftStates(runner, runner.state_cache_spec, num_seqs, snapshots)


def test_rows_live_then_snapshots_and_none_shared() -> None:
    runner, pool = states()
    assert len(runner.states) == 2 * (1 + 3)
    assert pool.allocate("a") and pool.allocate("b") and not pool.allocate("c")
    seen: set[int] = set()
    for req_id in ("a", "b"):
        for _ in range(4):  # one more than the rows: the extra snapshot is not taken
            pool.snapshot(req_id)
            pool.advance(req_id, 1)
        rows = {dst for src, dst in pool.take_copies() if src == pool.slots[req_id]}
        assert len(rows) == 3 and all(2 <= r < 8 for r in rows) and not rows & seen
        seen |= rows


def test_rewind_copies_the_snapshot_of_the_kept_tokens() -> None:
    _, pool = states()
    pool.allocate("a")
    pool.advance("a", 10)  # the prompt
    for _ in range(3):  # drafts 1..3 fed, each after a snapshot of the state before it
        pool.snapshot("a")
        pool.advance("a", 1)
    assert len(pool.take_copies()) == 3  # live row -> snapshot rows: the states after 10, 11, 12 tokens
    assert pool.rewind("a", 13) == 13 and pool.copies == []  # every fed draft kept: nothing to copy
    pool.advance("a", 1)
    pool.snapshot("a")
    pool.advance("a", 1)
    pool.take_copies()
    assert pool.rewind("a", 14) == 14  # one of the two kept: snapshot at 14 back into the live row
    assert pool.copies == [(pool.num_seqs + pool.slots["a"] * 3, pool.slots["a"])]
    assert pool.restores_total == 1 and pool.tokens["a"] == 14


def test_a_state_no_row_holds_goes_back_to_zero_and_free_drops_copies() -> None:
    _, pool = states()
    pool.allocate("a")
    pool.advance("a", 10)
    assert pool.rewind("a", 9) == 0 and pool.tokens["a"] == 0  # the last token fed again: prefill
    pool.advance("a", 10)
    pool.snapshot("a")
    pool.advance("a", 1)
    pool.take_copies()
    pool.rewind("a", 10)
    assert pool.copies and pool.copies[0][1] == pool.slots["a"]
    pool.free("a")
    assert pool.copies == [] and pool.allocate("b") and pool.tokens["b"] == 0
