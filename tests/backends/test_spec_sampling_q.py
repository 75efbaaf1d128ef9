"""Speculative sampling with the draft's real distribution q (engine/spec_sampling.py, the draft proposer,
the torch sampler): the first two tokens of unseeded sampled requests follow the target's exact
distribution (chi-square against probabilities computed from the transformers model), and the same test
fails when the rule is broken (accept every draft); a draft that differs from the target is kept often,
not always; q is the request's processed distribution (the numpy pipeline equals the torch sampler's);
grammar requests never get drafts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch import sampler as torch_sampler
from localchat.engine import draft_model
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_inputs import build_sampling_inputs
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.spec_sampling import processed_probs, resolve_drafts
from localchat.weights.bundle import ModelBundle
from tests.backends.test_speculative_torch import CHI2_999, MODEL_VOCAB, run, summary
from tests.helpers.draft_models import draft_engine, noisy_draft
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

# chi-square 99.9% quantiles for 16..25 degrees of freedom (1..15: CHI2_999)
CHI2_999_MORE = [39.25, 40.79, 42.31, 43.82, 45.31, 46.80, 48.27, 49.73, 51.18, 52.62]
PROMPT = FakeTokenizer().encode("sample me")
PARAMS = SamplingParams(temperature=0.9, top_k=40, max_tokens=4, ignore_eos=True)
N = 1500


@pytest.fixture(scope="module")
def target_hf() -> torch.nn.Module:
    """Output layer scaled up: a few tokens hold most of the mass at each position."""
    model: Any = tiny_hf_model("llama", vocab_size=MODEL_VOCAB)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def target(target_hf: torch.nn.Module) -> ModelBundle:
    return bundle_from_hf(target_hf, "tiny-peaked")


@pytest.fixture(scope="module")
def draft(target_hf: torch.nn.Module) -> ModelBundle:
    """The target with noise on every weight: its q is close to p but clearly not p."""
    return noisy_draft(target_hf, seed=5, name="tiny-peaked-draft")


def make_engine(target: ModelBundle, draft: ModelBundle | None) -> LLMEngine:
    """Up to 64 requests speculating together, every random source seeded with 0."""
    return draft_engine(target, draft, max_batch=64, kv_cache_mib=32, seed=0, max_num_seqs=64)


def chi2_999(df: int) -> float:
    table = CHI2_999 + CHI2_999_MORE
    return table[min(df, len(table)) - 1]


def _dist(logits: torch.Tensor) -> torch.Tensor:
    """The target's sampling distribution under PARAMS (temperature, then top-k), from raw logits."""
    scaled = logits.double() / PARAMS.temperature
    kth = torch.topk(scaled, PARAMS.top_k, dim=-1).values[..., -1:]
    return torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1)


@pytest.fixture(scope="module")
def exact_pairs(target_hf: torch.nn.Module) -> dict[tuple[int, int], float]:
    """P(first token, second token) under the target, from the transformers model itself."""
    with torch.no_grad():
        first = _dist(target_hf(torch.tensor([PROMPT])).logits[0, -1])
        likely = [int(t) for t in torch.nonzero(first > 1e-4).flatten()]
        batch = torch.tensor([[*PROMPT, t] for t in likely])
        second = _dist(target_hf(batch).logits[:, -1])
    return {
        (a, int(b)): float(first[a] * second[i, b]) for i, a in enumerate(likely) for b in range(MODEL_VOCAB)
    }


def chi_square_exact(pairs: list[tuple[int, int]], exact: dict[tuple[int, int], float]) -> tuple[float, int]:
    """Pearson's statistic of the observed pairs against the exact probabilities: cells expecting at
    least 10 draws, the rest pooled into one."""
    n = len(pairs)
    cells = [c for c, p in exact.items() if p * n >= 10]
    observed = Counter(pairs)
    counts = [observed[c] for c in cells]
    expected = [exact[c] * n for c in cells]
    counts.append(n - sum(counts))
    expected.append(n - sum(expected))
    stat = sum((o - e) ** 2 / e for o, e in zip(counts, expected, strict=True))
    return stat, len(cells)


def first_pairs(engine: LLMEngine) -> list[tuple[int, int]]:
    outs = run(engine, [PROMPT] * N, [PARAMS] * N)
    return [(summary(o)[0][0], summary(o)[0][1]) for o in outs]


def test_sampled_drafts_keep_the_target_distribution(
    target: ModelBundle, draft: ModelBundle, exact_pairs: dict[tuple[int, int], float]
) -> None:
    engine = make_engine(target, draft)
    pairs = first_pairs(engine)
    # Every second token was judged as a draft from q; q differs from p, so some were replaced.
    assert engine.spec_draft_tokens >= N
    assert 0.3 * engine.spec_draft_tokens < engine.spec_accepted_tokens < 0.97 * engine.spec_draft_tokens
    stat, df = chi_square_exact(pairs, exact_pairs)
    print(f"rule: chi-square {stat:.1f}, df {df}")
    assert df >= 5
    assert stat < chi2_999(df), (stat, df)
    # Plain sampling passes the same test (the exact probabilities are right).
    stat, df = chi_square_exact(first_pairs(make_engine(target, None)), exact_pairs)
    assert stat < chi2_999(df), (stat, df)


def test_the_chi_square_catches_a_wrong_rule(
    target: ModelBundle,
    draft: ModelBundle,
    exact_pairs: dict[tuple[int, int], float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keeping every draft (the second token then follows q, not p) fails the same test."""

    def accept_always(probs: Any, noise: Any, uniform: Any, drafts: np.ndarray, q: Any) -> list[int]:
        return [int(d) for d in drafts]

    monkeypatch.setattr(torch_sampler, "resolve_drafts", accept_always)
    engine = make_engine(target, draft)
    stat, df = chi_square_exact(first_pairs(engine), exact_pairs)
    assert engine.spec_accepted_tokens == engine.spec_draft_tokens
    print(f"accept-always: chi-square {stat:.1f}, df {df}")
    assert stat > 3 * chi2_999(df), (stat, df)


def test_the_rule_alone_gives_p_for_any_q() -> None:
    """resolve_drafts over many rows with drafts drawn from q: the kept tokens are distributed as p
    (exact expected counts), and the share kept is sum(min(p, q))."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = np.array([0.1, 0.4, 0.1, 0.1, 0.1, 0.2])
    n = 40_000
    drafts = rng.choice(len(q), size=n, p=q)
    noise = rng.exponential(size=(n, len(p)))
    tokens = resolve_drafts(np.tile(p, (n, 1)), noise, rng.random(n), drafts, np.tile(q, (n, 1)))
    counts = np.bincount(tokens, minlength=len(p))
    assert counts[5] == 0  # p = 0: never kept, never drawn
    expected = p[:5] * n
    stat = float((((counts[:5] - expected) ** 2) / expected).sum())
    assert stat < CHI2_999[3], (counts, expected)
    kept = float(np.mean(np.asarray(tokens) == drafts))
    assert kept == pytest.approx(np.minimum(p, q).sum(), abs=0.01)


def _sampler_rows(n: int) -> tuple[np.ndarray, np.ndarray, Any, np.ndarray]:
    """n identical verification rows (temperature 1 over 6 tokens) with drafts drawn from a q unlike p."""
    rng = np.random.default_rng(1)
    p = np.array([0.45, 0.25, 0.15, 0.1, 0.05, 0.0])
    q = np.array([0.05, 0.5, 0.1, 0.1, 0.05, 0.2])
    logits = np.log(np.maximum(p, 1e-30)).astype(np.float32)
    logits[5] = -np.inf
    drafts = rng.choice(6, size=n, p=q)
    params = SamplingParams(temperature=1.0)
    inputs = build_sampling_inputs(
        [(params, [1], 1)] * n, [(i, int(d), q.astype(np.float32)) for i, d in enumerate(drafts)]
    )
    return p, np.tile(logits, (n, 1)), inputs, drafts


@pytest.mark.parametrize("backend", ["torch", pytest.param("mlx", marks=pytest.mark.mlx)])
def test_each_sampler_applies_the_rule(backend: str) -> None:
    """Both samplers, given verification rows with q: tokens distributed as p, drafts kept with
    probability sum(min(p, q)), a token p excludes never produced."""
    n = 4000
    p, logits, inputs, drafts = _sampler_rows(n)
    if backend == "torch":
        tokens = torch_sampler.sample(
            torch.from_numpy(logits), inputs, torch_sampler.new_generator(torch.device("cpu"), 3)
        ).token_ids
    else:
        mx = pytest.importorskip("mlx.core")
        from localchat.backends.mlx import sampler as mlx_sampler

        result, _ = mlx_sampler.sample(mx.array(logits), inputs, mlx_sampler.new_key(3))
        tokens = result.token_ids
    counts = np.bincount(tokens, minlength=6)
    assert counts[5] == 0
    stat = float((((counts[:5] - p[:5] * n) ** 2) / (p[:5] * n)).sum())
    assert stat < CHI2_999[3], counts
    kept = float(np.mean(np.asarray(tokens) == drafts))
    assert kept == pytest.approx(0.55, abs=0.03)  # sum(min(p, q)) = 0.05 + 0.25 + 0.1 + 0.1 + 0.05 + 0


def test_q_is_processed_like_the_target_samplers_p() -> None:
    """processed_probs (the draft's q) equals the torch sampler's distribution for the same rows: bias,
    penalties, temperature, top-k, top-p, min-p, and a grammar mask."""
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(4, vocab) * 3
    history = [3, 4, 4, 9, 10, 10, 10]
    rows = [
        (SamplingParams(temperature=0.7, top_k=10, logit_bias={5: 4.0, 6: -100.0}), history, 3),
        (
            SamplingParams(temperature=1.2, top_p=0.8, repetition_penalty=1.3, frequency_penalty=0.5),
            history,
            3,
        ),
        (SamplingParams(temperature=1.0, min_p=0.1, presence_penalty=0.7), history, 2),
        (SamplingParams(temperature=0.5, top_k=20, top_p=0.9, min_p=0.05), history, 3),
    ]
    inputs = build_sampling_inputs(rows)
    allowed = np.ones((4, vocab), dtype=bool)
    allowed[3, ::2] = False
    inputs.token_bitmask = _pack(allowed)
    q = processed_probs(logits.numpy(), inputs)
    # The torch sampler's own pipeline, step by step.
    x = torch_sampler._constrain(logits.clone(), inputs)
    x = torch_sampler._apply_penalties(x.clone(), inputs.penalized_rows, inputs)
    x = x / torch.tensor(inputs.temperature)[:, None]
    x = torch_sampler._top_p(torch_sampler._top_k(x, inputs.top_k.tolist()), inputs.top_p.tolist())
    p = torch.softmax(x, dim=-1)
    floor = torch.tensor(inputs.min_p)[:, None] * p.amax(dim=-1, keepdim=True)
    p = p.masked_fill(p < floor, 0.0)
    p = p / p.sum(dim=-1, keepdim=True)
    np.testing.assert_allclose(q, p.double().numpy(), atol=1e-5)
    assert q[0, 6] == 0 and (q[3, ::2] == 0).all()


def _pack(allowed: np.ndarray) -> np.ndarray:
    """The bitmask layout of engine/constraint.py: 32 tokens per int32 word, bit i of word w = token
    32 w + i."""
    rows, vocab = allowed.shape
    words = -(-vocab // 32)
    out = np.zeros((rows, words), dtype=np.uint32)
    for token in range(vocab):
        out[:, token // 32] |= allowed[:, token].astype(np.uint32) << np.uint32(token % 32)
    return out.view(np.int32)


def test_grammar_requests_get_no_draft_model_drafts(target: ModelBundle, draft: ModelBundle) -> None:
    """A grammar would have to be advanced over the guesses: constrained requests decode without drafts
    (so no q needs the grammar's mask), while an unconstrained neighbour still speculates."""
    from localchat.structured.grammar import json_schema_constraint
    from localchat.structured.vocabulary import grammar_tokenizer

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = json_schema_constraint(grammar_tokenizer(FakeTokenizer(), MODEL_VOCAB), schema)
    engine = make_engine(target, draft)
    asked: list[str] = []
    assert engine.draft is not None
    propose = engine.draft.propose

    def spy(wanted: list[Any], live: set[str]) -> dict[str, list[int]]:
        asked.extend(r.req_id for r, _ in wanted)
        return propose(wanted, live)

    engine.scheduler.proposer.propose = spy  # type: ignore[method-assign]
    params = [
        SamplingParams(temperature=1.0, max_tokens=30, constraint=constraint),
        SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True),
    ]
    outs = run(engine, [PROMPT, PROMPT], params)
    assert outs[0][-1].finish_reason is not None
    assert asked and set(asked) == {outs[1][0].req_id}


def test_drafts_drawn_from_q_are_kept_more_often_than_greedy_ones(
    target: ModelBundle, draft: ModelBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same requests with the draft proposing greedily (q one-hot, as before) keep fewer drafts:
    min(1, p/q) keeps sum(min(p, q)) of them, a greedy draft only p(argmax q)."""
    sampled = make_engine(target, draft)
    first_pairs(sampled)
    monkeypatch.setattr(draft_model, "draft_params", lambda params: draft_model.GREEDY)
    greedy = make_engine(target, draft)
    first_pairs(greedy)
    rate = sampled.spec_accepted_tokens / sampled.spec_draft_tokens
    greedy_rate = greedy.spec_accepted_tokens / greedy.spec_draft_tokens
    print(f"kept: drawn from q {rate:.3f}, greedy {greedy_rate:.3f}")
    assert rate > greedy_rate + 0.05


def test_top_p_over_a_large_vocabulary_matches_the_torch_sampler() -> None:
    """Past TOP_P_CANDIDATES tokens only the most likely are sorted when they hold p; a flat row whose
    cut lies past them sorts everything. Both equal the torch sampler's top-p."""
    torch.manual_seed(1)
    vocab = 6000
    peaked = torch.randn(vocab)
    peaked[:40] += 9.0  # the mass sits in a few dozen tokens
    flat = 0.01 * torch.randn(vocab)  # p = 0.9 needs ~5,400 tokens
    logits = torch.stack([peaked, flat])
    params = SamplingParams(temperature=1.0, top_p=0.9)
    inputs = build_sampling_inputs([(params, [1], 1)] * 2)
    q = processed_probs(logits.numpy(), inputs)
    p = torch.softmax(torch_sampler._top_p(logits, [0.9, 0.9]), dim=-1).double().numpy()
    np.testing.assert_allclose(q, p, atol=1e-6)
    assert 0 < (q[0] > 0).sum() < 1024 < (q[1] > 0).sum()


def test_logprobs_max_tokens_and_stops_with_drafts_drawn_from_q(
    target_hf: torch.nn.Module, target: ModelBundle, draft: ModelBundle
) -> None:
    """Unseeded sampled requests whose drafts come from q: every token's logprob (and top ids) is the
    target's raw log-softmax at its position, computed again by transformers over the finished text;
    max_tokens is never passed and a stop string ends the text where it first appears."""
    engine = make_engine(target, draft)
    free = [SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True, logprobs=2)] * 4
    first = run(engine, [PROMPT] * 4, free)
    common = Counter("".join(summary(o)[1] for o in first)).most_common(1)[0][0]
    stop = SamplingParams(
        temperature=0.8, top_p=0.9, max_tokens=12, ignore_eos=True, logprobs=0, stop=[common]
    )
    params = free + [stop] * 4
    outs = first + run(engine, [PROMPT] * 4, [stop] * 4)
    assert engine.spec_accepted_tokens > 0
    stopped = 0
    for out, p in zip(outs, params, strict=True):
        tokens, text, reason, *_ = summary(out)
        assert len(tokens) <= p.max_tokens
        if p.stop:
            assert common not in text
            stopped += reason == "stop"
        with torch.no_grad():
            logits = target_hf(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1]
        expected = torch.log_softmax(logits.double(), dim=-1)
        got = [lp for o in out for lp in o.logprobs]
        assert [lp.token_id for lp in got] == tokens
        assert [lp.logprob for lp in got] == pytest.approx(
            [float(expected[i, t]) for i, t in enumerate(tokens)], abs=1e-3
        )
        for i, lp in enumerate(got):
            assert [t for t, _ in lp.top] == torch.topk(expected[i], p.logprobs or 0).indices.tolist()
    assert stopped > 0
