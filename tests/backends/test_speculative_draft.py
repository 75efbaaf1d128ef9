"""Speculative decoding with a draft model (engine/draft_model.py) through the torch runner on tiny random
models sharing the fake tokenizer: greedy and seeded output token-identical to plain decoding with a draft
that is a perturbed copy of the target (some drafts kept, some rolled back) and with the target as its
own draft (nearly all kept); stops / max_tokens / logprobs unchanged; unseeded sampling distributed like
the target (two-sample chi-square); the draft's cache stays in step across many requests."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.backends.test_speculative_torch import (
    CHI2_999,
    MODEL_VOCAB,
    chi_square_two_sample,
    logprob_values,
    prompts,
    run,
    summary,
)
from tests.helpers.draft_models import draft_engine, noisy_draft
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model


@pytest.fixture(scope="module")
def target_hf() -> torch.nn.Module:
    return tiny_hf_model("llama", vocab_size=MODEL_VOCAB)


@pytest.fixture(scope="module")
def target(target_hf: torch.nn.Module) -> ModelBundle:
    return bundle_from_hf(target_hf)


@pytest.fixture(scope="module")
def near_draft(target_hf: torch.nn.Module) -> ModelBundle:
    return noisy_draft(target_hf)


PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=1.0, seed=7, max_tokens=60, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True),  # max_tokens inside a draft run
    SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=30, repetition_penalty=1.2),
] * 2


def test_greedy_and_seeded_outputs_match_with_a_partly_agreeing_draft(
    target: ModelBundle, near_draft: ModelBundle
) -> None:
    # Eight requests with max_batch 6: no speculation until the two short ones end, then rows with and
    # without drafts share steps.
    off_outs = run(draft_engine(target, None), prompts(), PARAMS)
    engine = draft_engine(target, near_draft, max_batch=6)
    on_outs = run(engine, prompts(), PARAMS)
    assert [summary(o) for o in on_outs] == [summary(o) for o in off_outs]
    for on, off in zip(on_outs, off_outs, strict=True):
        assert logprob_values(on) == pytest.approx(logprob_values(off), abs=1e-3)
    assert len(logprob_values(on_outs[0])) == 60
    # Drafts were scored, some kept and some rolled back.
    assert 0 < engine.spec_accepted_tokens < engine.spec_draft_tokens
    stats = engine.stats()
    assert stats.speculative_method == "draft"
    assert 0 < stats.spec_acceptance_rate < 1
    assert stats.tokens_per_target_pass > 1
    # Every request ended: the draft freed its shadows and cache blocks with them.
    engine.step()
    assert engine.draft is not None and not engine.draft.shadows
    assert engine.draft.block_manager.num_used_blocks == 0


def test_the_target_as_its_own_draft_is_almost_always_accepted(target: ModelBundle) -> None:
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 4
    off = [summary(o) for o in run(draft_engine(target, None), prompts()[:4], params)]
    engine = draft_engine(target, target)
    on = [summary(o) for o in run(engine, prompts()[:4], params)]
    assert on == off
    assert engine.spec_accepted_tokens >= 0.95 * engine.spec_draft_tokens > 0
    # k=4, nearly all kept: about five tokens per target pass after the first.
    assert engine.stats().tokens_per_target_pass > 3.5


def test_doubtful_drafts_are_not_proposed(target: ModelBundle, near_draft: ModelBundle) -> None:
    """With p_min, a row stops drafting at the first guess the draft gives less than p_min: fewer
    drafts are scored, a larger share of them kept, and the output is unchanged."""
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 4
    every = draft_engine(target, near_draft)
    confident = draft_engine(target, near_draft, p_min=0.05)
    assert [summary(o) for o in run(confident, prompts()[:4], params)] == [
        summary(o) for o in run(every, prompts()[:4], params)
    ]
    assert 0 < confident.spec_draft_tokens < every.spec_draft_tokens
    rate = confident.spec_accepted_tokens / confident.spec_draft_tokens
    assert rate > every.spec_accepted_tokens / every.spec_draft_tokens


def test_stop_strings_end_where_they_would_without_speculation(
    target: ModelBundle, near_draft: ModelBundle
) -> None:
    base = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    reference = [summary(o) for o in run(draft_engine(target, None), prompts(), [base] * 8)]
    params = []
    for _, text, *_ in reference:
        at = len(text) * 4 // 5
        stop = [text[at : at + 2]] if text[at : at + 2] else []
        params.append(SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, stop=stop))
    off = [summary(o) for o in run(draft_engine(target, None), prompts(), params)]
    engine = draft_engine(target, target, max_batch=8)
    on = [summary(o) for o in run(engine, prompts(), params)]
    assert on == off
    assert any(reason == "stop" for _, _, reason, _, _ in on)
    assert engine.spec_accepted_tokens > 0


def test_the_draft_cache_is_freed_and_reused_across_requests(
    target: ModelBundle, near_draft: ModelBundle
) -> None:
    """Requests one pair after another through one engine, then the same prompts again: the draft finds
    their prefixes in its own cache (its shadows were freed, their blocks kept), and every output still
    equals plain decoding's."""
    engine = draft_engine(target, near_draft, max_num_seqs=2)
    plain = draft_engine(target, None, max_num_seqs=2)
    params = [SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)] * 2
    for start in (0, 2, 4, 0):
        batch = prompts()[start : start + 2]
        assert [summary(o) for o in run(engine, batch, params)] == [
            summary(o) for o in run(plain, batch, params)
        ]
        assert engine.draft is not None and not engine.draft.shadows
    assert engine.draft is not None and engine.draft.block_manager.prefix_hits > 0
    assert engine.spec_accepted_tokens > 0


@pytest.fixture(scope="module")
def peaked(target_hf: torch.nn.Module) -> ModelBundle:
    """The target with its output layer scaled up: a few tokens hold most of the mass, so a greedy
    draft is kept often, not always, at temperature 1."""
    model: Any = copy.deepcopy(target_hf)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return bundle_from_hf(model, "tiny-peaked")


def test_sampled_tokens_follow_the_target_distribution(peaked: ModelBundle) -> None:
    """The target drafts for itself, drawing from its own distribution (q = p): min(1, p/q) = 1 keeps
    every draft. The joint distribution of the first two sampled tokens must match plain sampling
    (test_spec_sampling_q.py checks a draft whose q differs from p against the exact distribution)."""
    prompt = FakeTokenizer().encode("draft me")
    params = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
    n = 600

    def sample(speculate: bool) -> tuple[list[tuple[int, ...]], LLMEngine]:
        engine = draft_engine(peaked, peaked if speculate else None, max_batch=64, max_num_seqs=64)
        outs = run(engine, [prompt] * n, [params] * n)
        return [tuple(summary(o)[0][:2]) for o in outs], engine

    on, engine = sample(True)
    off, _ = sample(False)
    assert engine.spec_draft_tokens >= n
    assert engine.spec_accepted_tokens == engine.spec_draft_tokens
    common = {pair for pair, count in Counter(off).items() if count >= 10}
    assert len(common) >= 3, Counter(off)
    on_cells = Counter(p if p in common else "other" for p in on)
    off_cells = Counter(p if p in common else "other" for p in off)
    stat, df = chi_square_two_sample(on_cells, off_cells)  # type: ignore[arg-type]
    assert stat < CHI2_999[min(df, len(CHI2_999)) - 1], (stat, df, on_cells, off_cells)
