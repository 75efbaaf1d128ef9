"""Constrained sampling through the torch runner (tiny random model, fp32, a model vocabulary wider
than the tokenizer's): seeded samples at temperature 1 follow the schema, and are the same alone as
batched under KV pressure that preempts and recomputes them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from localchat.backends.fake import EOS_ID, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.structured.grammar import json_schema_constraint
from localchat.structured.vocabulary import grammar_tokenizer
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

MODEL_VOCAB = 320  # the fake tokenizer has 259 tokens: ids 259-319 must never be sampled
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    },
    "required": ["color", "n", "tag"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def bundle():  # type: ignore[no-untyped-def]
    return bundle_from_hf(tiny_hf_model("llama", vocab_size=MODEL_VOCAB))


def generate(bundle, prompts: list[list[int]], seeds: list[int], config: EngineConfig):  # type: ignore[no-untyped-def]
    engine = LLMEngine(
        fp32_runner(bundle), FakeTokenizer(), config, eos_token_ids=[EOS_ID], model_max_len=512
    )
    constraint = json_schema_constraint(grammar_tokenizer(FakeTokenizer(), MODEL_VOCAB), SCHEMA)
    ids = [
        engine.add_request(
            p, SamplingParams(temperature=1.0, seed=seed, max_tokens=80, constraint=constraint)
        )
        for p, seed in zip(prompts, seeds, strict=True)
    ]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    reasons = {}
    while engine.has_unfinished:
        for out in engine.step():
            tokens[out.req_id] += out.new_token_ids
            if out.finished:
                reasons[out.req_id] = out.finish_reason
    return [tokens[i] for i in ids], [reasons[i] for i in ids], engine.scheduler.num_preemptions


def test_seeded_constrained_samples_validate_alone_and_under_preemption(bundle) -> None:  # type: ignore[no-untyped-def]
    tokenizer = FakeTokenizer()
    prompts = [tokenizer.encode(f"request {i}: " + "context " * 14) for i in range(16)]
    roomy = EngineConfig(kv_cache_mib=16, block_size=4)
    alone = [generate(bundle, [p], [seed], roomy)[0][0] for seed, p in enumerate(prompts)]
    # 1 MiB at 512 bytes per token (2 layers x 2 KV heads x 16 dims x fp32 x K,V) = 2048 tokens, fewer
    # than the 16 requests need together: some are preempted and recomputed.
    together, reasons, preemptions = generate(
        bundle, prompts, list(range(16)), EngineConfig(kv_cache_mib=1, block_size=4)
    )
    assert preemptions > 0
    assert together == alone
    for ids, reason in zip(together, reasons, strict=True):
        assert reason == FinishReason.STOP  # the grammar ended the request
        assert max(ids) < tokenizer.vocab_size
        jsonschema.validate(json.loads(tokenizer.decode(ids)), SCHEMA)
    assert len({tuple(ids) for ids in together}) > 1  # temperature 1 really sampled
