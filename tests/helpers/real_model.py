"""Shared by the real-model tests of both runners: the reference chat prompts, batched greedy
generation through the engine, and the top-2 logits at a divergence point."""

from __future__ import annotations

from typing import Any

import numpy as np

from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from localchat.weights.chat_template import ChatTemplate
from tests.helpers.fake_engine import drain
from tests.helpers.torch_batch import PagedDriver

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion to a child."]
NEW_TOKENS = 48


def chat_prompts(bundle: ModelBundle) -> list[list[int]]:
    """PROMPTS as single-turn chats, rendered with the model's template and tokenized."""
    tokenizer = bundle.tokenizer
    template = ChatTemplate(
        bundle.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
    )
    return [
        tokenizer.encode(template.render([{"role": "user", "content": p}]), add_special_tokens=False)
        for p in PROMPTS
    ]


def greedy(runner: Any, bundle: ModelBundle, prompts: list[list[int]]) -> list[list[int]]:
    """All prompts at once through the engine (batched decode steps), NEW_TOKENS each, EOS ignored."""
    engine = LLMEngine(
        runner,
        bundle.tokenizer,
        EngineConfig(kv_cache_mib=64),
        eos_token_ids=bundle.config.eos_token_ids,
        model_max_len=bundle.config.max_position_embeddings,
    )
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    out: dict[str, list[int]] = {i: [] for i in ids}
    for o in drain(engine):  # raises on an error finish
        out[o.req_id].extend(o.new_token_ids)
    return [out[i] for i in ids]


def top2(runner: Any, tokens: list[int]) -> tuple[int, int, float]:
    """(top-1 id, top-2 id, their logit gap) for the token after `tokens`."""
    driver = PagedDriver(runner, num_blocks=64, block_size=16)
    driver.add("m", tokens)
    _, logits = driver.step_logits()
    row = np.asarray(logits[0]).astype(np.float32, copy=False)  # torch or mlx array
    first, second = np.argsort(-row)[:2]
    return int(first), int(second), float(row[first] - row[second])


def assert_greedy_tracks(
    ours: Any, reference: Any, bundle: ModelBundle, prompts: list[list[int]], near_tie: float, label: str
) -> None:
    """Token-identical to the reference's greedy output until a near-tie: only a token whose reference
    top-2 gap is below `near_tie` may flip (to the other of the two), and at least one prompt matches."""
    got, want = greedy(ours, bundle, prompts), greedy(reference, bundle, prompts)
    identical = 0
    for prompt, a, b in zip(prompts, got, want, strict=True):
        if a == b:
            identical += 1
            continue
        at = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        first, second, gap = top2(reference, prompt + b[:at])
        detail = f"first difference at token {at}: {label} {a[at]}, fp32 {b[at]}; fp32 top-2 gap {gap:.3f}"
        assert {a[at], b[at]} == {first, second} and gap < near_tie, detail
    assert identical >= 1
