"""A hybrid draft model (engine/draft_states.py) through the torch runner: a tiny random Qwen3.5, Granite
4.0-H or LFM2 drafting for the same kind of target (the draft: the target with its weights perturbed, so
it agrees part of the time) and for a non-hybrid target (a bigram Llama that follows the draft's own text every other token).
Drafts are rejected part-way, so each round must start from the draft's state after exactly the kept
tokens: every proposal is checked against the draft model's own greedy continuation of the sequence so
far (plain decoding on the draft), the target's output against plain decoding, and with the copy back
from the snapshot skipped the drafts go wrong."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from localchat.engine.draft_states import DraftStates
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.backends.test_hybrid_spec_torch import assert_same, bigram_draft, engine, prompts, run
from tests.helpers.fake_engine import drain
from tests.helpers.tiny_hybrids import BUILDERS
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

Outputs = list[tuple[list[int], list[float]]]
Proposals = list[tuple[list[int], list[int]]]  # (the sequence so far, the drafts proposed after it)


def perturbed(build: Callable[..., Any], noise: float = 0.01) -> ModelBundle:
    """The target's tiny model with noise on its weights: drafts it both right and wrong (accepted
    34 / 88, 8 / 41, 32 / 74 for Qwen3.5, Granite, LFM2 at 0.01)."""
    hf: Any = build()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if not (name.endswith("A_log") or name.endswith("dt_bias")):
                param.add_(noise * torch.randn(param.shape, generator=gen))
    return bundle_from_hf(hf, "hybrid-draft")


@pytest.fixture(scope="module", params=list(BUILDERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def draft(kind: str) -> ModelBundle:
    return perturbed(BUILDERS[kind])


@pytest.fixture(scope="module")
def target(kind: str) -> ModelBundle:
    return bundle_from_hf(BUILDERS[kind]())


def record_proposals(eng: LLMEngine) -> Proposals:
    proposer = eng.draft
    assert proposer is not None and proposer.states is not None  # the draft runs as a hybrid
    proposals: Proposals = []
    propose = proposer.propose

    def spy(wanted: list[Any], live: set[str]) -> dict[str, list[int]]:
        out = propose(wanted, live)
        proposals.extend((list(r.all_token_ids), out[r.req_id]) for r, _ in wanted if out.get(r.req_id))
        return out

    proposer.propose = spy  # type: ignore[method-assign]
    return proposals


def wrong_proposals(draft: ModelBundle, proposals: Proposals, make_runner: Callable[..., Any]) -> int:
    """How many proposals differ from the draft model's greedy continuation by plain decoding."""
    reference = engine(draft, "off", make_runner=make_runner)
    wrong = 0
    for context, drafts in proposals:
        params = SamplingParams(max_tokens=len(drafts), temperature=0.0)
        reference.add_request(context, params)
        tokens = [t for out in drain(reference) for t in out.new_token_ids]
        wrong += tokens != drafts
    return wrong


def check_hybrid_draft(
    target: ModelBundle,
    draft: ModelBundle,
    make_runner: Callable[..., Any],
    params: SamplingParams | None = None,
) -> tuple[LLMEngine, Outputs, Proposals]:
    plain = run(engine(target, "off", make_runner=make_runner), params=params)
    eng = engine(target, "draft", draft, make_runner)
    assert eng.speculation_note == ""
    proposals = record_proposals(eng)
    assert_same(run(eng, params=params), plain)
    assert 0 < eng.spec_accepted_tokens < eng.spec_draft_tokens  # drafts rejected part-way
    assert eng.draft is not None and eng.draft.states is not None and eng.draft.states.restores_total > 0
    return eng, plain, proposals


def test_hybrid_draft_for_a_hybrid_target_is_exact(target: ModelBundle, draft: ModelBundle) -> None:
    _, _, proposals = check_hybrid_draft(target, draft, fp32_runner)
    assert wrong_proposals(draft, proposals, fp32_runner) == 0


def test_hybrid_draft_seeded_sampling_equals_plain_sampling(target: ModelBundle, draft: ModelBundle) -> None:
    params = SamplingParams(max_tokens=30, temperature=0.3, seed=11, logprobs=0)
    check_hybrid_draft(target, draft, fp32_runner, params)


def test_hybrid_draft_unseeded_sampling_runs(target: ModelBundle, draft: ModelBundle) -> None:
    """Drafts drawn from q (the draft's logits through compute_logits) with the state rewound each round."""
    eng = engine(target, "draft", draft)
    params = SamplingParams(max_tokens=30, temperature=0.8)
    assert all(len(tokens) == 30 for tokens, _ in run(eng, params=params))
    assert eng.spec_draft_tokens > 0


def test_hybrid_draft_for_a_plain_transformer_target(draft: ModelBundle) -> None:
    check_plain_target(draft, fp32_runner)


def check_plain_target(draft: ModelBundle, make_runner: Callable[..., Any]) -> None:
    """A bigram Llama target that follows the draft's own greedy text where that is a bigram chain."""
    follow: dict[int, int] = {}
    for prompt, (tokens, _) in zip(
        prompts(), run(engine(draft, "off", make_runner=make_runner)), strict=True
    ):
        seq = prompt + tokens
        for x, y in itertools.pairwise(seq):
            follow.setdefault(x, y)
    llama = bigram_draft(follow)
    _, _, proposals = check_hybrid_draft(llama, draft, make_runner)
    assert wrong_proposals(draft, proposals, make_runner) == 0


def test_skipping_the_copy_back_changes_the_drafts(
    target: ModelBundle, draft: ModelBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the snapshot -> live row copy the draft continues from a state that went through the
    rejected drafts: its proposals are no longer its own greedy continuation (the target's output stays
    exact: it checks every draft)."""
    eng = engine(target, "draft", draft)
    exact = engine(target, "draft", draft)
    proposals, exact_proposals = record_proposals(eng), record_proposals(exact)
    rewind = DraftStates.rewind

    def no_copy(self: DraftStates, req_id: str, tokens: int) -> int:
        kept = rewind(self, req_id, tokens)
        self.copies = [c for c in self.copies if c[1] != self.slots[req_id]]
        return kept

    run(exact)
    monkeypatch.setattr(DraftStates, "rewind", no_copy)
    run(eng)
    assert wrong_proposals(draft, proposals, fp32_runner) > 0
    assert wrong_proposals(draft, exact_proposals, fp32_runner) == 0
    assert eng.spec_accepted_tokens != exact.spec_accepted_tokens


def test_a_state_no_row_holds_prefills_again(
    target: ModelBundle, draft: ModelBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no snapshot to restore from (none taken here), a shadow whose drafts were rejected goes back
    to position 0 and prefills again: more draft work, the same proposals."""
    monkeypatch.setattr(DraftStates, "snapshot", lambda self, req_id: None)
    eng = engine(target, "draft", draft)
    proposals = record_proposals(eng)
    run(eng)
    assert eng.draft is not None and eng.draft.states is not None
    assert eng.draft.states.restores_total == 0 and eng.spec_accepted_tokens < eng.spec_draft_tokens
    assert wrong_proposals(draft, proposals, fp32_runner) == 0
