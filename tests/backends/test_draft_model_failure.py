"""The draft model's pool when something fails (engine/draft_model.py): a draft pass that raises costs
that step its drafts (the engine goes on, outputs equal plain decoding's), leaves no block named whose
K/V it never wrote and no shadow holding blocks; a failed target step with drafts in it, and an abort
mid-speculation, free the request's shadow and its draft blocks; any proposer that raises (an EAGLE
head's, say) costs the step its drafts, never the engine. Tiny random torch target and draft
(tests/helpers/draft_models.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.backends.test_speculative_torch import MODEL_VOCAB, prompts, run, summary
from tests.helpers.draft_models import draft_engine, noisy_draft
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def pair() -> tuple[ModelBundle, ModelBundle]:
    target_hf = tiny_hf_model("llama", vocab_size=MODEL_VOCAB)
    return bundle_from_hf(target_hf), noisy_draft(target_hf)


def break_call(runner: Any, name: str, at: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`runner.<name>` raises on its `at`-th call (0-based), before touching anything; returns a list
    that holds the number of calls so far."""
    real = getattr(runner, name)
    calls = [0]

    def maybe_broken(scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        calls[0] += 1
        if calls[0] - 1 == at:
            raise RuntimeError("draft device lost")
        return real(scheduler_output, batch)

    monkeypatch.setattr(runner, name, maybe_broken)
    return calls


def assert_pool_idle(engine: LLMEngine) -> None:
    draft = engine.draft
    assert draft is not None and not draft.shadows
    bm = draft.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks


@pytest.mark.parametrize("at", [0, 1, 5], ids=["prompt-pass", "first-decode-pass", "later-pass"])
def test_a_failing_draft_pass_costs_only_that_steps_drafts(
    pair: tuple[ModelBundle, ModelBundle], at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    target, draft = pair
    batch = prompts()[:2]
    want = [summary(o) for o in run(draft_engine(target, None), batch, [GREEDY] * 2)]
    engine = draft_engine(target, draft)
    assert engine.draft is not None
    bm = engine.draft.block_manager
    calls = break_call(engine.draft.runner, "execute_model", at, monkeypatch)
    ids = [engine.add_request(p, GREEDY) for p in batch]
    outs: dict[str, list[Any]] = {i: [] for i in ids}
    failed_at_step = -1
    while engine.has_unfinished:
        before = calls[0]
        for out in engine.step():  # without the fix: the draft's error escapes the engine's step
            assert out.finish_reason != FinishReason.ERROR, out.error
            outs[out.req_id].append(out)
        if before <= at < calls[0]:
            failed_at_step = bm.step - 1
            # Nothing the failed call's propose named stays named, and its shadows are gone.
            assert all(bm.blocks[b].named_in_step != failed_at_step for b in bm.cached_blocks.values())
            assert not engine.draft.shadows
    assert failed_at_step >= 0
    assert [summary(outs[i]) for i in ids] == want
    assert engine.spec_accepted_tokens > 0  # speculation went on after the failure
    assert_pool_idle(engine)


def test_a_failed_target_step_with_drafts_frees_the_shadow(
    pair: tuple[ModelBundle, ModelBundle], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    target, draft = pair
    engine = draft_engine(target, draft)
    real = engine.runner.execute_model
    seen_drafts = [False]

    def fail_with_drafts(scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        if len(batch.sample_req_ids) > len(batch.req_ids) and not seen_drafts[0]:
            seen_drafts[0] = True
            raise RuntimeError("target device lost")
        return real(scheduler_output, batch)

    monkeypatch.setattr(engine.runner, "execute_model", fail_with_drafts)
    prompt = prompts()[0]
    (outs,) = run(engine, [prompt], [GREEDY])
    assert seen_drafts[0] and outs[-1].finish_reason == FinishReason.ERROR
    assert_pool_idle(engine)
    # The engine goes on: the same prompt again, speculating from the draft's prefix cache.
    hits = engine.draft.block_manager.prefix_hits  # type: ignore[union-attr]
    (again,) = run(engine, [prompt], [GREEDY])
    assert summary(again) == summary(run(draft_engine(target, None), [prompt], [GREEDY])[0])
    assert engine.draft.block_manager.prefix_hits > hits  # type: ignore[union-attr]
    assert_pool_idle(engine)


def test_an_abort_mid_speculation_frees_the_shadow(pair: tuple[ModelBundle, ModelBundle]) -> None:
    torch.set_num_threads(1)
    target, draft = pair
    engine = draft_engine(target, draft)
    keep, stop = (engine.add_request(p, GREEDY) for p in prompts()[:2])
    while engine.spec_draft_tokens == 0:
        engine.step()
    assert engine.draft is not None and stop in engine.draft.shadows
    assert engine.abort_request(stop) is not None
    assert stop not in engine.draft.shadows
    tokens = [
        t for _ in iter(lambda: engine.has_unfinished, False) for o in engine.step() for t in o.new_token_ids
    ]
    assert tokens and keep not in engine.scheduler.requests
    assert_pool_idle(engine)


def test_a_proposer_that_raises_costs_the_step_its_drafts(
    pair: tuple[ModelBundle, ModelBundle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proposing runs inside scheduling, outside the step's error handling: an error there used to end
    the engine's step (and its thread). The proposer's whole call failing twice."""
    torch.set_num_threads(1)
    target, draft = pair
    engine = draft_engine(target, draft)
    proposer = engine.scheduler.proposer
    real = proposer.propose
    calls = [0]

    def flaky(wanted: list[Any], live: set[str]) -> dict[str, list[int]]:
        calls[0] += 1
        if calls[0] in (2, 3):
            raise RuntimeError("head device lost")
        return real(wanted, live)

    monkeypatch.setattr(proposer, "propose", flaky)
    batch = prompts()[:2]
    outs = run(engine, batch, [GREEDY] * 2)
    assert calls[0] > 3 and engine.spec_draft_tokens > 0
    assert [summary(o) for o in outs] == [
        summary(o) for o in run(draft_engine(target, None), batch, [GREEDY] * 2)
    ]
