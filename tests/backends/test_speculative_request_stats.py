"""Per-request speculation counts (RequestOutput.spec_draft_tokens / spec_accepted_tokens /
num_target_passes, shown in the web UI's per-message stats): each request's counts equal the drafts the
engine scored and kept for it, as seen by a witness on the acceptance step; they sum to the engine's
/metrics totals when requests share steps; a plain engine reports no drafts and one pass per token."""

from __future__ import annotations

import pytest

from localchat.engine import engine as engine_module
from localchat.engine.engine import LLMEngine
from localchat.engine.outputs import RequestOutput
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.backends.test_speculative_draft import near_draft, target, target_hf  # noqa: F401
from tests.backends.test_speculative_torch import prompts, run
from tests.helpers.draft_models import draft_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def witness(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(drafts scored, drafts kept) of every acceptance the engine makes, recorded from accept_drafts."""
    seen: list[tuple[int, int]] = []
    real = engine_module.accept_drafts

    def recording(drafts: list[int], sampled: list[int]) -> list[int]:
        kept = real(drafts, sampled)
        seen.append((len(drafts), len(kept) - 1))
        return kept

    monkeypatch.setattr(engine_module, "accept_drafts", recording)
    return seen


def final(outs: list[RequestOutput]) -> RequestOutput:
    assert outs[-1].finished
    return outs[-1]


@pytest.mark.parametrize("draft_kind", ["self", "near"])
def test_each_request_counts_the_drafts_scored_and_kept_for_it(
    monkeypatch: pytest.MonkeyPatch,
    target: ModelBundle,  # noqa: F811
    near_draft: ModelBundle,  # noqa: F811
    draft_kind: str,
) -> None:
    engine = draft_engine(target, target if draft_kind == "self" else near_draft)
    seen = witness(monkeypatch)
    for prompt in prompts()[:3]:  # one at a time: every acceptance the witness sees is this request's
        seen.clear()
        passes_before = engine.sequence_passes
        out = final(run(engine, [prompt], [GREEDY])[0])
        assert out.num_output_tokens == 40
        assert out.spec_draft_tokens == sum(d for d, _ in seen) > 0
        assert out.spec_accepted_tokens == sum(a for _, a in seen)
        assert out.num_target_passes == engine.sequence_passes - passes_before
        # Every pass gives the target's own token plus the drafts it kept (the last may be cut by
        # max_tokens), so passes + accepted covers the output.
        assert out.num_target_passes + out.spec_accepted_tokens >= out.num_output_tokens
        if draft_kind == "self":  # the target drafting for itself: nearly every draft kept
            assert out.spec_accepted_tokens >= 0.95 * out.spec_draft_tokens
            assert out.num_output_tokens / out.num_target_passes > 3
        else:
            assert 0 <= out.spec_accepted_tokens < out.spec_draft_tokens


def test_counts_of_requests_sharing_steps_sum_to_the_engine_totals(
    target: ModelBundle,  # noqa: F811
    near_draft: ModelBundle,  # noqa: F811
) -> None:
    engine = draft_engine(target, near_draft, max_batch=6)
    outs = [final(o) for o in run(engine, prompts()[:4], [GREEDY] * 4)]
    assert sum(o.spec_draft_tokens for o in outs) == engine.spec_draft_tokens > 0
    assert sum(o.spec_accepted_tokens for o in outs) == engine.spec_accepted_tokens > 0
    assert sum(o.num_target_passes for o in outs) == engine.sequence_passes
    stats = engine.stats()
    assert stats.tokens_per_target_pass == pytest.approx(
        sum(o.num_output_tokens for o in outs) / sum(o.num_target_passes for o in outs)
    )


def test_a_plain_engine_reports_no_drafts_and_one_pass_per_token(target: ModelBundle) -> None:  # noqa: F811
    engine: LLMEngine = draft_engine(target, None)
    for out in (final(o) for o in run(engine, prompts()[:2], [GREEDY] * 2)):
        assert (out.spec_draft_tokens, out.spec_accepted_tokens) == (0, 0)
        assert out.num_target_passes == out.num_output_tokens == 40
