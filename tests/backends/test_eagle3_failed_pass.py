"""An EAGLE-3 head whose pass raises (backends/torch/eagle3_proposer.py): the engine drops that step's
drafts (engine/speculative.py `propose_safely`), and the head must come out of it as if the pass had
never run, or it drafts from a cache with positions missing (outputs stay exact, drafts get worse).

A second proposer over the same head shadows the engine's: it is fed the same target rows and asked for
the same drafts at every step, and its passes raise at chosen steps (the pass feeding the target rows,
and a later one-row draft pass). At every step after a failure its drafts equal the engine's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from localchat.backends.torch.eagle3_proposer import Eagle3Proposer, _Feed
from localchat.engine import speculative
from localchat.engine.request import Request
from localchat.engine.speculative import propose_safely
from tests.backends.test_speculative_eagle3 import (
    DAMPING,
    damped,
    greedy,
    make_engine,
    random_head,
    write_head,
)
from tests.backends.test_speculative_torch import MODEL_VOCAB, prompts, run, summary
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

# Propose calls (1-based) whose first head pass (the target rows of every request at once) raises; the
# first call from DRAFT_FAILURE_FROM on with a second pass (a draft pass, after the target rows went in)
# has that one raise.
TARGET_ROW_FAILURES = {3, 12, 20}
DRAFT_FAILURE_FROM = 5


class Injected(RuntimeError):
    pass


def test_a_failed_head_pass_leaves_the_head_as_if_it_never_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A random head's drafts are nearly all rejected: keep every sequence proposing k drafts every step.
    monkeypatch.setattr(speculative, "pause_after", lambda misses: 0)
    monkeypatch.setattr(speculative, "SHRINK_AFTER_LOW_STEPS", 10**6)
    target_hf = damped(tiny_hf_model("llama", vocab_size=MODEL_VOCAB, num_hidden_layers=4), DAMPING)
    target = bundle_from_hf(target_hf)
    head = write_head(tmp_path / "rand", random_head(seed=5))
    off = [summary(o) for o in run(make_engine(target, None), prompts()[:4], greedy(40))]
    engine = make_engine(target, head)
    proposer: Any = engine.scheduler.proposer
    shadow = Eagle3Proposer(proposer.head, proposer.model, proposer.token_limit)
    taps: Any = engine.runner.hidden_taps  # type: ignore[attr-defined]
    file_step = taps.sink

    def both(batch: Any, aux: torch.Tensor) -> None:
        file_step(batch, aux)
        shadow.file_step(batch, aux)

    taps.sink = both
    calls = {"propose": 0, "pass": 0}
    failures: list[tuple[int, int]] = []  # (propose call, pass) that raised
    passing = shadow._pass

    def failing_pass(feed: _Feed) -> dict[str, torch.Tensor]:
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
    dropped: list[dict[str, list[int]]] = []  # the shadow's drafts in steps where it raised
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
    assert [summary(o) for o in run(engine, prompts()[:4], greedy(40))] == off
    assert sorted(n for _, n in failures) == [1, 1, 1, 2], failures
    assert dropped == [{}] * 4  # those steps decode without the shadow's drafts
    assert sum(len(d) for d, _ in compared) >= 40
    assert [s for _, s in compared] == [d for d, _ in compared]
