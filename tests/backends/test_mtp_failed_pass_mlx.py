"""An MLX MTP head whose pass raises (backends/mlx/mtp_proposer.py): the engine drops that step's drafts
(engine/speculative.py `propose_safely`), and the head must come out of it as if the pass had never run
(the pending target rows back, the pass's cache rows dropped), or it drafts from a cache with positions
missing. As test_eagle3_failed_pass.py does for torch: a second proposer over the same head shadows the
engine's, fed the same target rows and asked for the same drafts every step; its passes raise at chosen
steps (the pass feeding the target rows, and a later one-row draft pass). After each failure its drafts
equal the engine's."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from localchat.backends.mlx.mtp_proposer import MtpProposer, _Feed
from localchat.engine import speculative
from localchat.engine.request import Request
from localchat.engine.speculative import propose_safely
from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.backends.test_speculative_mtp import GREEDY, bundle, mtp_tensors, run
from tests.backends.test_speculative_mtp_mlx import engine

pytestmark = pytest.mark.mlx

TARGET_ROW_FAILURES = {3, 9}  # propose calls (1-based) whose first pass (the target rows) raises
DRAFT_FAILURE_FROM = 5  # the first call from here on with a second pass has that one raise


class Injected(RuntimeError):
    pass


def test_a_failed_head_pass_leaves_the_head_as_if_it_never_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    # A random head's drafts are nearly all rejected: keep every sequence proposing k drafts every step.
    monkeypatch.setattr(speculative, "pause_after", lambda misses: 0)
    monkeypatch.setattr(speculative, "SHRINK_AFTER_LOW_STEPS", 10**6)
    hf = tiny_qwen3_5(seed=2)
    target = bundle(hf, mtp_tensors(hf, seed=1))
    plain = run(engine(target, "off"), GREEDY)
    eng = engine(target, "mtp")
    proposer: Any = eng.scheduler.proposer
    shadow = MtpProposer(proposer.head, proposer.token_limit, proposer.stream)
    runner: Any = eng.runner
    file_step = runner.hidden_sink

    def both(batch: Any, hidden: mx.array) -> None:
        file_step(batch, hidden)
        shadow.file_step(batch, hidden)

    runner.hidden_sink = both
    calls = {"propose": 0, "pass": 0}
    failures: list[tuple[int, int]] = []
    passing = shadow._pass

    def failing_pass(feed: _Feed) -> dict[str, mx.array]:
        calls["pass"] += 1
        call, number = calls["propose"], calls["pass"]
        draft_failed = any(n == 2 for _, n in failures)
        if (call in TARGET_ROW_FAILURES and number == 1) or (
            call >= DRAFT_FAILURE_FROM and number == 2 and not draft_failed
        ):
            failures.append((call, number))
            raise Injected("the head's pass failed")
        return passing(feed)

    shadow._pass = failing_pass  # type: ignore[method-assign]
    compared: list[tuple[list[int], list[int]]] = []
    dropped: list[dict[str, list[int]]] = []
    propose = proposer.propose

    def witness(wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        drafts = propose(wanted, live)
        calls["propose"] += 1
        calls["pass"] = 0
        before = len(failures)
        shadowed = propose_safely(shadow, wanted, live)
        if len(failures) > before:
            dropped.append(shadowed)
        elif failures:
            compared.extend((drafts[r], shadowed.get(r, [])) for r in drafts)
        return drafts

    proposer.propose = witness
    assert run(eng, GREEDY) == plain
    assert sorted(n for _, n in failures) == [1, 1, 2], failures
    assert dropped == [{}] * 3  # those steps decode without the shadow's drafts
    assert sum(len(d) for d, _ in compared) >= 20
    assert [s for _, s in compared] == [d for d, _ in compared]
