"""The default model with the default sampling writes answers that end. With temperature 1.0 and no
truncation SmolLM2 ran the README's haiku prompt to 4,096 tokens of one repeated glyph; with the defaults
(localchat/sampling_defaults.py) and the loop guard every answer ends well inside the chat's cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat.config import Settings
from localchat.engine.config import EngineConfig
from localchat.engine.sampling_params import SamplingParams
from localchat.llm import LLM
from localchat.sampling_defaults import resolve

pytestmark = pytest.mark.slow

HAIKU = "Write a haiku about tea"  # the README's example
EVERYDAY = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what a CPU does in two sentences.",
    "Write a short, friendly email declining a meeting.",
    "How do I reverse a list in Python?",
]
# All ten seeds for the haiku; fewer for the rest, to keep the test near a minute on two cores.
JOBS = [(HAIKU, seed) for seed in range(1, 11)] + [(p, seed) for p in EVERYDAY for seed in range(1, 5)]
BOUND = 1024  # measured worst case over seeds 1-10 of all six prompts: 522 tokens


def test_everyday_prompts_end_with_the_default_sampling(smollm2_gguf: Path) -> None:
    settings = Settings()
    llm = LLM(smollm2_gguf, engine_config=EngineConfig(kv_cache_mib=256, max_num_seqs=len(JOBS)))
    defaults = resolve({}, settings.sampling_defaults, llm.model.generation_defaults)
    assert defaults["min_p"] > 0 and defaults["top_p"] < 1  # the truncation that keeps it on track
    ids: dict[str, tuple[str, int]] = {}
    for prompt, seed in JOBS:
        params = SamplingParams(
            **defaults, max_tokens=settings.chat_max_tokens, seed=seed, loop_stop=settings.loop_stop
        )
        ids[
            llm.engine.add_request(llm.apply_chat_template([{"role": "user", "content": prompt}]), params)
        ] = (
            prompt,
            seed,
        )
    ends: dict[str, tuple[int, str, object]] = {}
    while llm.engine.has_unfinished:
        for out in llm.engine.step():
            if out.finished:
                assert out.error is None, out.error
                ends[out.req_id] = (out.num_output_tokens, str(out.finish_reason), out.stop_reason)
    by_eos = sum(1 for n, reason, _ in ends.values() if reason == "stop")
    by_loop = sum(1 for _, _, why in ends.values() if why == "repetition")
    print(f"\n{len(ends)} answers: {by_eos} ended by EOS, {by_loop} by the loop guard")
    for req_id, (n, reason, why) in ends.items():
        prompt, seed = ids[req_id]
        assert n <= BOUND, f"{prompt!r} seed {seed}: {n} tokens ({reason}, {why})"
        assert reason == "stop" or why == "repetition", f"{prompt!r} seed {seed} ran to max_tokens"
    assert by_eos >= 0.8 * len(JOBS)
