"""Speculative decoding and prefix caching together on real hybrid layers (torch runner, float32): tiny
random Qwen3.5 (gated DeltaNet), Granite 4.0-H (Mamba-2) and LFM2 (short conv).

Agent-style waves: chats sharing a system prompt over three tool sets run together with speculation on,
then their next turns, regenerated answers and new chats together, in a KV pool small enough to preempt
and with 4 checkpoint rows. So fork cuts, ranked eviction, restores, copy backs (drafts rejected
part-way) and decode checkpoints moved from spec rows all happen in the same steps. Every output equals
a cold run without speculation or prefix caching (tokens, logprobs within 1e-3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.backends.test_hybrid_draft_torch import perturbed
from tests.backends.test_hybrid_spec_torch import bigram_draft
from tests.backends.test_hybrid_spec_torch import engine as spec_engine
from tests.helpers.fake_engine import drain
from tests.helpers.tiny_hybrids import BUILDERS
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

VOCAB = 256
BLOCK = 16
MAX_TOKENS = 24
Result = tuple[list[int], list[float]]


def engine(
    target: ModelBundle,
    method: str,
    draft: ModelBundle | None = None,
    make_runner: Callable[[ModelBundle], Any] = fp32_runner,
    **config: object,
) -> LLMEngine:
    """The spec suite's engine in a 1 MiB pool (preempts) with room for the agents' long prompts."""
    config = {"kv_cache_mib": 1, "block_size": BLOCK, **config}
    return spec_engine(target, method, draft, make_runner, model_max_len=4096, **config)


def run_all(eng: LLMEngine, prompts: dict[str, list[int]]) -> dict[str, Result]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    for req_id, prompt in prompts.items():
        eng.add_request(prompt, params, req_id=req_id)
    got: dict[str, Result] = {r: ([], []) for r in prompts}
    for out in drain(eng):
        tokens, logprobs = got[out.req_id]
        got[out.req_id] = (tokens + out.new_token_ids, logprobs + [lp.logprob for lp in out.logprobs])
    return got


def first_wave() -> dict[str, list[int]]:
    """Six agents' first chats: a shared system prompt (10 blocks), one of three tool sets (5 blocks),
    then their own long message (so that four at once overflow the pool)."""
    rng = np.random.default_rng(11)

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, VOCAB, size=n)]

    system = tokens(10 * BLOCK)
    tools = {name: tokens(5 * BLOCK) for name in "abc"}
    return {f"c{i}": system + tools["abcaba"[i]] + tokens(380 + 5 * i) for i in range(6)}


def second_wave(first: dict[str, list[int]], replies: dict[str, Result]) -> dict[str, list[int]]:
    """Each chat's next turn (its prompt, reply and a new message), two regenerated answers, and two new
    chats on known tool sets."""
    rng = np.random.default_rng(12)
    turns = {
        f"{r}next": p + replies[r][0] + [int(t) for t in rng.integers(3, VOCAB, size=7)]
        for r, p in first.items()
    }
    again = {f"{r}again": first[r] for r in ("c1", "c4")}
    new = {
        f"n{i}": first[f"c{i}"][: 15 * BLOCK] + [int(t) for t in rng.integers(3, VOCAB, 13)] for i in (0, 2)
    }
    return {**turns, **again, **new}


@pytest.fixture(scope="module", params=list(BUILDERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def target(kind: str) -> ModelBundle:
    build: Callable[..., Any] = BUILDERS[kind]
    return bundle_from_hf(build())


@pytest.mark.parametrize("method", ["ngram", "draft", "hybrid-draft"])
def test_agent_waves_speculating_under_preemption_equal_cold_runs(
    kind: str, target: ModelBundle, method: str
) -> None:
    check_agent_waves(kind, target, method, fp32_runner)


def check_agent_waves(
    kind: str, target: ModelBundle, method: str, make_runner: Callable[[ModelBundle], Any]
) -> None:
    """The module's scenario on `make_runner`'s runner (the MLX suite passes its own). `method`: ngram,
    draft (a bigram Llama knowing every other next token of the cold replies) or hybrid-draft (the
    target's own kind with its weights perturbed: engine/draft_states.py)."""
    cold = engine(target, "off", make_runner=make_runner, enable_prefix_caching=False)
    first = first_wave()
    expected = {r: run_all(cold, {r: p})[r] for r, p in first.items()}
    draft = None
    if method == "draft":  # knows every other next token of the cold replies: drafts kept part-way
        follow: dict[int, int] = {}
        for r, p in first.items():
            seq = p[-3:] + expected[r][0]
            follow.update({x: y for x, y in zip(seq[::2], seq[1::2], strict=False)})
        draft = bigram_draft(follow)
    elif method == "hybrid-draft":
        draft, method = perturbed(BUILDERS[kind]), "draft"
    eng = engine(
        target, method, draft, make_runner, max_num_seqs=4, state_checkpoints=4, prefill_chunk_size=48
    )
    got = run_all(eng, first)
    second = second_wave(first, got)
    got |= run_all(eng, second)
    expected |= {r: run_all(cold, {r: p})[r] for r, p in second.items()}
    for req_id in {**first, **second}:
        tokens, logprobs = got[req_id]
        assert tokens == expected[req_id][0], req_id
        assert np.abs(np.asarray(logprobs) - np.asarray(expected[req_id][1])).max() < 1e-3, req_id
    stats = eng.stats()
    spec_rows = eng.scheduler.spec_rows
    assert spec_rows is not None and spec_rows.fixups_total > 0  # verify steps that rejected drafts
    assert eng.scheduler.num_preemptions > 0
    assert stats.state_checkpoint_restores_total >= 4
    if method == "draft":  # (both drafts)
        assert 0 < eng.spec_accepted_tokens < eng.spec_draft_tokens
