"""Speculative decoding on hybrid models through the torch runner (engine/hybrid_spec.py,
backends/torch/state_cache.py `StepRows.verify`): tiny random Qwen3.5 (gated DeltaNet; the C step and
the torch forms), Granite 4.0-H (Mamba-2) and LFM2 (short conv), float32. Greedy output with n-gram
lookup and with a draft model (a tiny Llama that knows some of the target's next tokens and guesses the
rest wrong) equals plain decoding token for token, with drafts rejected part-way, so the state after the
kept tokens must come back from the spec rows; with the copy back skipped it does not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.cpu import deltanet_step
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from tests.helpers.fake_engine import drain
from tests.helpers.tiny_hybrids import BUILDERS
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

VOCAB = 256
BLOCK = 4


def prompts() -> list[list[int]]:
    """A repeated phrase (n-gram lookup finds it) and random text, per request."""
    rng = np.random.default_rng(3)
    phrase = [int(t) for t in rng.integers(3, VOCAB, size=9)]
    return [phrase * 4 + phrase[:4], [int(t) for t in rng.integers(3, VOCAB, size=23)]]


def engine(
    target: ModelBundle,
    method: str,
    draft: ModelBundle | None = None,
    make_runner: Callable[[ModelBundle], Any] = fp32_runner,
    model_max_len: int = 512,
    **config: object,
) -> LLMEngine:
    """An engine on `target` (`make_runner`: the torch runner in float32, or the MLX suite's); `config`
    overrides EngineConfig fields (e.g. a small `kv_cache_mib` that preempts)."""
    # ngram_min 1: random tiny models hardly repeat two tokens, so single-token matches make the drafts
    spec = SpeculativeConfig(method, num_tokens=4, max_batch=4, ngram_min=1, draft_p_min=0.0)
    cfg = EngineConfig(**{"kv_cache_mib": 8, "block_size": BLOCK, "speculative": spec, **config})  # type: ignore[arg-type]
    return LLMEngine(
        make_runner(target),
        FakeTokenizer(),
        cfg,
        eos_token_ids=[],
        model_max_len=model_max_len,
        draft_runner=make_runner(draft) if draft is not None else None,
        vocab_size=VOCAB,
    )


def run(
    eng: LLMEngine, max_tokens: int = 40, params: SamplingParams | None = None
) -> list[tuple[list[int], list[float]]]:
    params = params or SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
    ids = [eng.add_request(p, params) for p in prompts()]
    got: dict[str, tuple[list[int], list[float]]] = {r: ([], []) for r in ids}
    for out in drain(eng):
        tokens, logprobs = got[out.req_id]
        got[out.req_id] = (tokens + out.new_token_ids, logprobs + [lp.logprob for lp in out.logprobs])
    return [got[r] for r in ids]


def assert_same(on: list[tuple[list[int], list[float]]], off: list[tuple[list[int], list[float]]]) -> None:
    for (tokens, logprobs), (plain_tokens, plain_logprobs) in zip(on, off, strict=True):
        assert tokens == plain_tokens
        assert np.abs(np.asarray(logprobs) - np.asarray(plain_logprobs)).max() < 1e-3


def bigram_draft(follow: dict[int, int]) -> ModelBundle:
    """A tiny Llama whose next token depends only on the current one (attention and MLP outputs zeroed):
    `follow[x]` after x (its LM head row y sums the normalised embeddings of the x with follow[x] = y),
    noise for any other token."""
    hf: Any = tiny_hf_model("llama", vocab_size=VOCAB, tie_word_embeddings=False, seed=4)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        hf.model.norm.weight.fill_(1.0)
        embed = hf.model.embed_tokens.weight
        head = torch.zeros_like(hf.lm_head.weight)
        for x, y in follow.items():
            head[y] += embed[x] / embed[x].norm()
        hf.lm_head.weight.copy_(10.0 * head)
    return bundle_from_hf(hf, "bigram-draft")


@pytest.fixture(scope="module", params=list(BUILDERS))
def target(request: pytest.FixtureRequest) -> ModelBundle:
    build: Callable[..., Any] = BUILDERS[request.param]
    return bundle_from_hf(build())


@pytest.fixture(scope="module")
def plain(target: ModelBundle) -> list[tuple[list[int], list[float]]]:
    return run(engine(target, "off"))


@pytest.mark.parametrize("kernel", ["c", "torch"])
def test_ngram_output_equals_plain_decoding(
    target: ModelBundle,
    plain: list[tuple[list[int], list[float]]],
    kernel: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bool] = []
    step = deltanet_step.deltanet_step

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(len(args) > 9 and args[9] is not None)  # keep: a verify row's states
        return step(*args, **kwargs)

    monkeypatch.setattr(deltanet_step, "deltanet_step", spy)
    if kernel == "torch":  # gated DeltaNet's torch forms (the others have no C step)
        monkeypatch.setattr(deltanet_step, "available", lambda *args, **kwargs: False)
    eng = engine(target, "ngram")
    assert eng.speculation_note == "" and eng.scheduler.spec_rows is not None
    assert_same(run(eng), plain)
    assert eng.spec_draft_tokens > 0 and eng.scheduler.spec_rows.fixups_total > 0
    # Qwen3.5 on CPU with the kernels: verify steps ran in the C step (keep given), or nothing did
    assert any(calls) == (kernel == "c" and target.config.model_type == "qwen3_5_text" and bool(calls))


def test_draft_model_rejected_part_way_equals_plain_decoding(
    target: ModelBundle, plain: list[tuple[list[int], list[float]]]
) -> None:
    check_draft_rejected_part_way(target, plain, fp32_runner)


def check_draft_rejected_part_way(
    target: ModelBundle, plain: list[tuple[list[int], list[float]]], make_runner: Callable[[ModelBundle], Any]
) -> None:
    follow: dict[int, int] = {}
    for prompt, (tokens, _) in zip(prompts(), plain, strict=True):
        seq = prompt + tokens
        for x, y in zip(seq[::2], seq[1::2], strict=False):  # every other pair: the rest are guesses
            follow.setdefault(x, y)
    eng = engine(target, "draft", bigram_draft(follow), make_runner)
    assert_same(run(eng), plain)
    spec_rows = eng.scheduler.spec_rows
    assert spec_rows is not None and spec_rows.fixups_total > 0  # verify steps that kept only some drafts
    assert 0 < eng.spec_accepted_tokens < eng.spec_draft_tokens


def test_skipping_the_copy_back_changes_the_output(
    target: ModelBundle, plain: list[tuple[list[int], list[float]]]
) -> None:
    """The check holds the spec rows to account: continuing from the state that went past the rejected
    drafts gives other tokens."""
    follow = {x: (x * 7 + 1) % VOCAB for x in range(VOCAB)}  # mostly wrong guesses
    for prompt, (tokens, _) in zip(prompts(), plain, strict=True):
        seq = prompt + tokens
        follow.update({x: y for x, y in zip(seq[::3], seq[1::3], strict=False)})
    eng = engine(target, "draft", bigram_draft(follow))
    spec_rows = eng.scheduler.spec_rows
    assert spec_rows is not None
    spec_rows.accepted = lambda *args: None  # type: ignore[method-assign]
    got = run(eng)
    assert [t for t, _ in got] != [t for t, _ in plain]


def test_seeded_sampling_with_a_draft_equals_plain_sampling(target: ModelBundle) -> None:
    """Seeded draws are token-identical to plain decoding's (each position's draw sees the drafts before it
    as output, docs/speculative.md "Exactness"), with drafts kept and rejected part-way."""
    params = SamplingParams(max_tokens=30, temperature=0.8, seed=11, logprobs=0)
    plain = run(engine(target, "off"), params=params)
    follow: dict[int, int] = {}
    for prompt, (tokens, _) in zip(prompts(), plain, strict=True):
        seq = prompt + tokens
        follow.update({x: y for x, y in zip(seq[::2], seq[1::2], strict=False)})
    eng = engine(target, "draft", bigram_draft(follow))
    assert_same(run(eng, params=params), plain)
    assert 0 < eng.spec_accepted_tokens < eng.spec_draft_tokens
