"""Speculative decoding (n-gram proposals) through the torch runner on a tiny random model: greedy and
seeded output token-identical to non-speculative decoding, stops / max_tokens / logprobs / grammars
unchanged, and unseeded sampling distributed like the target (two-sample chi-square)."""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import pytest

from localchat.backends.fake import EOS_ID, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.outputs import RequestOutput
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.structured.grammar import json_schema_constraint
from localchat.structured.vocabulary import grammar_tokenizer
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

MODEL_VOCAB = 259  # the fake tokenizer's: every sampled id decodes
# chi-square 99.9% quantiles by degrees of freedom (1..15): a false alarm once in 1000 runs at most.
CHI2_999 = [
    10.83,
    13.82,
    16.27,
    18.47,
    20.52,
    22.46,
    24.32,
    26.12,
    27.88,
    29.59,
    31.26,
    32.91,
    34.53,
    36.12,
    37.70,
]


@pytest.fixture(scope="module")
def bundle():  # type: ignore[no-untyped-def]
    return bundle_from_hf(tiny_hf_model("llama", vocab_size=MODEL_VOCAB))


def make_engine(bundle, speculate: bool, max_batch: int = 4, **config: object) -> LLMEngine:  # type: ignore[no-untyped-def]
    spec = SpeculativeConfig("ngram" if speculate else "off", num_tokens=4, max_batch=max_batch)
    cfg = EngineConfig(kv_cache_mib=16, block_size=4, speculative=spec, **config)  # type: ignore[arg-type]
    return LLMEngine(fp32_runner(bundle), FakeTokenizer(), cfg, eos_token_ids=[EOS_ID], model_max_len=512)


def run(
    engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]
) -> list[list[RequestOutput]]:
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    outs: dict[str, list[RequestOutput]] = {i: [] for i in ids}
    while engine.has_unfinished:
        for out in engine.step():
            outs[out.req_id].append(out)
    return [outs[i] for i in ids]


def summary(outs: list[RequestOutput]) -> tuple[list[int], str, str, object, list[tuple[int, list[int]]]]:
    tokens = [t for o in outs for t in o.new_token_ids]
    text = "".join(o.text_delta for o in outs)
    return tokens, text, str(outs[-1].finish_reason), outs[-1].stop_reason, logprob_ids(outs)


def logprob_ids(outs: list[RequestOutput]) -> list[tuple[int, list[int]]]:
    """The sampled and top token ids of each logprobs entry (the values are compared apart: float
    sums in a differently shaped batch differ in the last bits)."""
    return [(lp.token_id, [t for t, _ in lp.top]) for o in outs for lp in o.logprobs]


def logprob_values(outs: list[RequestOutput]) -> list[float]:
    return [lp.logprob for o in outs for lp in o.logprobs]


def prompts() -> list[list[int]]:
    tok = FakeTokenizer()
    texts = ["def f(x): return x + 1\ndef g(x): return x + 1\n", "abc abc abc abc", "hello world", "zq"]
    return [tok.encode(t * 2) for t in texts] + [tok.encode(f"prompt {i} " * 3) for i in range(4)]


def test_greedy_and_seeded_outputs_match_without_speculation(bundle) -> None:  # type: ignore[no-untyped-def]
    # Eight requests with max_batch 6: no speculation until the two short ones end, then rows with and
    # without drafts share steps.
    params = [
        SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, seed=7, max_tokens=60, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True),  # max_tokens inside a draft run
        SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=30, repetition_penalty=1.2),
    ] * 2
    off_outs = run(make_engine(bundle, False), prompts(), params)
    engine = make_engine(bundle, True, max_batch=6)
    on_outs = run(engine, prompts(), params)
    assert [summary(o) for o in on_outs] == [summary(o) for o in off_outs]
    for on, off in zip(on_outs, off_outs, strict=True):
        assert logprob_values(on) == pytest.approx(logprob_values(off), abs=1e-3)
    assert logprob_values(on_outs[0]) and len(logprob_ids(on_outs[0])) == 60
    assert engine.spec_accepted_tokens > 0  # drafts were really scored and kept
    assert engine.spec_accepted_tokens < engine.spec_draft_tokens  # and some were rolled back


def test_stop_strings_end_where_they_would_without_speculation(bundle) -> None:  # type: ignore[no-untyped-def]
    base = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    reference = [summary(o) for o in run(make_engine(bundle, False), prompts(), [base] * 8)]
    # A stop string from late in each greedy answer, where the repeats that drafts cover have begun.
    params = []
    for _, text, *_ in reference:
        at = len(text) * 4 // 5
        stop = [text[at : at + 2]] if text[at : at + 2] else []
        params.append(SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, stop=stop))
    off = [summary(o) for o in run(make_engine(bundle, False), prompts(), params)]
    engine = make_engine(bundle, True, max_batch=8)
    on = [summary(o) for o in run(engine, prompts(), params)]
    assert on == off
    assert any(reason == "stop" for _, _, reason, _, _ in on)
    assert engine.spec_accepted_tokens > 0


def test_repeated_prompt_is_prefix_cached_after_speculative_rollbacks(bundle) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(bundle, True)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    first = summary(run(engine, prompts()[:1], [params])[0])[0]
    # The prompt plus the whole answer again: every full block must be found under the right tokens.
    again = prompts()[0] + first
    second = summary(run(engine, [again], [params])[0])[0]
    reference = summary(run(make_engine(bundle, False), [again], [params])[0])[0]
    assert second == reference
    assert engine.block_manager.prefix_hits >= (len(again) - 1) // 4 * 4 - 4


def test_grammar_rows_are_not_speculated_and_still_validate(bundle) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    constraint = json_schema_constraint(grammar_tokenizer(FakeTokenizer(), MODEL_VOCAB), schema)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, constraint=constraint) for s in range(2)]
    params += [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)] * 2
    off = [summary(o) for o in run(make_engine(bundle, False), prompts()[:4], params)]
    on = [summary(o) for o in run(make_engine(bundle, True), prompts()[:4], params)]
    assert on == off
    for tokens, *_ in on[:2]:
        jsonschema.validate(json.loads(FakeTokenizer().decode(tokens)), schema)


def chi_square_two_sample(a: Counter[object], b: Counter[object]) -> tuple[float, int]:
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    cells = [c for c in set(a) | set(b) if a[c] + b[c] > 0]
    for c in cells:
        stat += ((nb / na) ** 0.5 * a[c] - (na / nb) ** 0.5 * b[c]) ** 2 / (a[c] + b[c])
    return stat, len(cells) - 1


def test_sampled_tokens_follow_the_target_distribution(bundle) -> None:  # type: ignore[no-untyped-def]
    """Three tokens hold most of the mass (logit_bias); the prompt makes the n-gram proposer guess one of
    them after each, so drafts are accepted with p(draft) and replaced otherwise. The joint distribution
    of the first two tokens must match non-speculative sampling."""
    a, b, c, z = 100, 101, 102, 103
    prompt = [5, 6, 7, z, a, b, z, b, c, z, c, a, z]
    params = SamplingParams(
        temperature=1.0, max_tokens=3, ignore_eos=True, logit_bias={a: 8.0, b: 7.6, c: 7.2}
    )
    n = 600

    def sample(speculate: bool) -> tuple[Counter[object], LLMEngine]:
        engine = make_engine(bundle, speculate, max_batch=64, max_num_seqs=64)
        outs = run(engine, [prompt] * n, [params] * n)
        pairs = [tuple(summary(o)[0][:2]) for o in outs]  # the second token is the first judged draft
        cells = {(x, y) for x in (a, b, c) for y in (a, b, c)}
        return Counter(p if p in cells else "other" for p in pairs), engine

    on, engine = sample(True)
    off, _ = sample(False)
    assert engine.spec_draft_tokens >= n // 2
    assert 0 < engine.spec_accepted_tokens < engine.spec_draft_tokens
    stat, df = chi_square_two_sample(on, off)
    assert stat < CHI2_999[df - 1], (stat, df, on, off)
