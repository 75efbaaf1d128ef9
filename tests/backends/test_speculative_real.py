"""Speculative decoding on the real SmolLM2-135M (torch runner, the machine's default dtype): greedy
output token-identical to plain greedy for a repeat-the-code prompt (drafts mostly accepted) and a chat
prompt (mostly rejected), two requests batched so that rows with and without drafts share steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.spec_bench import PROMPTS
from localchat import LLM, SamplingParams
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative import SpeculativeConfig

pytestmark = pytest.mark.slow


def test_greedy_is_token_identical_with_ngram_speculation(smollm2_gguf: Path) -> None:
    llm = LLM(smollm2_gguf, backend="torch", engine_config=EngineConfig(kv_cache_mib=32))
    prompts = [llm.apply_chat_template([{"role": "user", "content": t}]) for t in PROMPTS.values()]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)

    def generate(spec: SpeculativeConfig) -> tuple[list[list[int]], LLMEngine]:
        engine = LLMEngine(
            llm.runner,
            llm.tokenizer,
            EngineConfig(kv_cache_mib=32, speculative=spec),
            eos_token_ids=llm.model.config.eos_token_ids or llm.tokenizer.eos_token_ids,
            model_max_len=2048,
        )
        ids = [engine.add_request(p, params) for p in prompts]
        out: dict[str, list[int]] = {i: [] for i in ids}
        while engine.has_unfinished:
            for o in engine.step():
                assert o.error is None
                out[o.req_id] += o.new_token_ids
        return [out[i] for i in ids], engine

    plain, _ = generate(SpeculativeConfig())
    speculative, engine = generate(SpeculativeConfig("ngram", num_tokens=4))
    assert speculative == plain
    # The code is repeated almost verbatim: most drafts are kept, and steps are saved.
    assert engine.spec_accepted_tokens > 0.5 * engine.spec_draft_tokens > 0
