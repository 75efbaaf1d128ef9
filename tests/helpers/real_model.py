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
TRACKED_STEPS = 16  # teacher-forced steps per prompt checked by assert_greedy_tracks


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


def next_logits(runner: Any, tokens: list[int]) -> np.ndarray:
    """The runner's float32 logits for the token after `tokens` (one paged prefill)."""
    driver = PagedDriver(runner, num_blocks=64, block_size=16)
    driver.add("m", tokens)
    _, logits = driver.step_logits()
    return np.asarray(logits[0]).astype(np.float32, copy=False)  # torch or mlx array


def top2(runner: Any, tokens: list[int]) -> tuple[int, int, float]:
    """(top-1 id, top-2 id, their logit gap) for the token after `tokens`."""
    row = next_logits(runner, tokens)
    first, second = np.argsort(-row)[:2]
    return int(first), int(second), float(row[first] - row[second])


def reference_gap(runner: Any, tokens: list[int], token: int) -> tuple[int, float]:
    """(the reference's top-1 id, how far `token`'s logit lies below it) for the token after `tokens`."""
    row = next_logits(runner, tokens)
    best = int(np.argmax(row))
    return best, float(row[best] - row[token])


def assert_greedy_tracks(
    ours: Any, reference: Any, bundle: ModelBundle, prompts: list[list[int]], near_tie: float, label: str
) -> None:
    """Token-identical to the reference's greedy output until a near-tie: where they first differ, the
    reference's token is its top-1 and ours lies within `near_tie` of it in the reference's logits (a
    second or third candidate that close is a tie within the quantization noise); and along the
    reference's own tokens, every step's pick is the reference's or such a near-tie (assert_teacher_forced:
    free generation alone could pass a wrong kernel hidden behind early near-ties on every prompt)."""
    got, want = greedy(ours, bundle, prompts), greedy(reference, bundle, prompts)
    for prompt, a, b in zip(prompts, got, want, strict=True):
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        if at == len(a):
            continue
        best, gap = reference_gap(reference, prompt + b[:at], a[at])
        detail = f"first difference at token {at}: {label} {a[at]}, fp32 {b[at]}; fp32 logit gap {gap:.3f}"
        assert best == b[at] and gap < near_tie, detail
    assert_teacher_forced(ours, reference, prompts, want, near_tie, label)


def assert_teacher_forced(
    ours: Any, reference: Any, prompts: list[list[int]], want: list[list[int]], near_tie: float, label: str
) -> None:
    """Both runners fed the reference's greedy tokens `want` for TRACKED_STEPS steps per prompt: at each
    step our top-1 is the reference's, or within `near_tie` of it in the reference's logits. Unlike the
    length of an identical free run (which one lucky or unlucky near-tie decides), this checks every
    position on one path, so a wrong kernel shows within a few steps."""
    for prompt, tokens in zip(prompts, want, strict=True):
        drivers = [PagedDriver(r, num_blocks=64, block_size=16) for r in (ours, reference)]
        for driver in drivers:
            driver.add("m", prompt)
        for step in range(min(TRACKED_STEPS, len(tokens))):
            mine, ref = (np.asarray(d.step_logits()[1][0]).astype(np.float32, copy=False) for d in drivers)
            pick, best = int(np.argmax(mine)), int(np.argmax(ref))
            gap = float(ref[best] - ref[pick])
            assert gap < near_tie, (
                f"teacher-forced step {step}: {label} picks {pick}, fp32 {best}; fp32 logit gap {gap:.3f}"
            )
            for driver in drivers:
                driver.feed("m", tokens[step])
