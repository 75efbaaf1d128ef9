"""Per-sequence adaptive draft length (speculative.record_outcome): K shrinks while a sequence's drafts
keep failing and grows back when they land, bounded by the configured k; the engine asks the proposer
for the adapted K and reports its average (EngineStats.spec_draft_length_avg, /metrics); output stays
token-identical to plain decoding."""

from __future__ import annotations

import pytest
import torch

from localchat.engine.engine import LLMEngine
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import draft_length, record_outcome
from localchat.weights.bundle import ModelBundle
from tests.backends.test_speculative_torch import MODEL_VOCAB, prompts, run, summary
from tests.helpers.draft_models import draft_engine, noisy_draft
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

K = 4


def test_k_shrinks_after_low_steps_and_grows_back_after_full_ones() -> None:
    request = Request("r", [1, 2, 3], SamplingParams())
    assert draft_length(request, K) == K  # not adapted yet: the configured k
    trace = []
    # (drafted, kept): two low steps shrink (from the second on), a half-kept step holds, full steps grow
    for drafted, kept in [(4, 1), (4, 0), (3, 1), (2, 0), (1, 1), (2, 1), (2, 2), (3, 3), (4, 4), (4, 4)]:
        record_outcome(request, drafted, kept, K)
        trace.append(draft_length(request, K))
    assert trace == [4, 3, 2, 1, 2, 2, 3, 4, 4, 4]
    assert request.spec_misses == 0 and request.spec_pause == 0
    record_outcome(request, 4, 0, K)
    assert request.spec_misses == 1 and request.spec_pause == 2  # the backoff still applies
    # A smaller configured k bounds an adapted K.
    assert draft_length(request, 2) == 2


@pytest.fixture(scope="module")
def target_hf() -> torch.nn.Module:
    return tiny_hf_model("llama", vocab_size=MODEL_VOCAB)


@pytest.fixture(scope="module")
def target(target_hf: torch.nn.Module) -> ModelBundle:
    return bundle_from_hf(target_hf)


@pytest.fixture(scope="module")
def near_draft(target_hf: torch.nn.Module) -> ModelBundle:
    """A noisy copy of the target: its greedy guesses are kept about a third of the time."""
    return noisy_draft(target_hf)


def make_engine(target: ModelBundle, draft: ModelBundle | None) -> LLMEngine:
    return draft_engine(target, draft, k=K)


def asked_lengths(engine: LLMEngine) -> tuple[list[int], list[float]]:
    """Run 4 greedy requests; the k the proposer was asked for each time (past the max_tokens cap) and
    the engine's average K after each step."""
    asked: list[int] = []
    averages: list[float] = []
    assert engine.draft is not None
    propose = engine.draft.propose

    def spy(wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        asked.extend(k for r, k in wanted if r.sampling_params.max_tokens - r.num_output_tokens > K + 1)
        averages.append(engine.stats().spec_draft_length_avg)
        return propose(wanted, live)

    engine.scheduler.proposer.propose = spy  # type: ignore[method-assign]
    return asked, averages


PARAMS = [SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)] * 4


def test_k_adapts_down_with_a_poor_draft_and_output_is_unchanged(
    target: ModelBundle, near_draft: ModelBundle
) -> None:
    plain = [summary(o) for o in run(make_engine(target, None), prompts()[:4], PARAMS)]
    engine = make_engine(target, near_draft)
    asked, averages = asked_lengths(engine)
    assert [summary(o) for o in run(engine, prompts()[:4], PARAMS)] == plain
    rate = engine.spec_accepted_tokens / engine.spec_draft_tokens
    assert rate < 0.6
    # Would fail if K never adapted: every request would ask for K each time.
    assert min(asked) < K and sum(asked) / len(asked) < K - 0.5
    assert max(asked) <= K
    assert min(averages) < K
    # Scored drafts per target pass went down with K: fewer rows spent on guesses that fail.
    assert engine.spec_draft_tokens / engine.sequence_passes < K - 0.5


def test_k_stays_at_the_configured_length_while_drafts_land(target: ModelBundle) -> None:
    engine = make_engine(target, target)  # the target as its own draft: every guess is kept
    asked, averages = asked_lengths(engine)
    run(engine, prompts()[:4], PARAMS)
    assert engine.spec_accepted_tokens == engine.spec_draft_tokens > 0
    assert asked and set(asked) == {K}
    assert all(a == K for a in averages[1:])
