"""Prefix caching of a hybrid model through state checkpoints (engine/state_checkpoints.py) on a real
runner (torch or MLX, tiny random weights), held to the same requests run cold (prefix caching off):
greedy tokens equal, logprobs within LOGPROB_TOL. Shared by the torch and MLX suites."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from localchat.backends.fake import FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import drain

LOGPROB_TOL = 1e-4
BLOCK = 16
Result = tuple[list[int], list[float], int]  # tokens, their logprobs, cached prompt tokens


def hybrid_engine(runner: Any, **config: object) -> LLMEngine:
    cfg = EngineConfig(**{"kv_cache_mib": 4, "block_size": BLOCK, "prefill_chunk_size": 48, **config})  # type: ignore[arg-type]
    return LLMEngine(runner, FakeTokenizer(), cfg, eos_token_ids=[], model_max_len=4096)


def run_all(engine: LLMEngine, prompts: dict[str, list[int]], max_tokens: int) -> dict[str, Result]:
    """Run `prompts` together (greedy, with logprobs)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
    for req_id, prompt in prompts.items():
        engine.add_request(prompt, params, req_id=req_id)
    got: dict[str, Result] = {r: ([], [], -1) for r in prompts}
    for out in drain(engine):
        tokens, logprobs, _ = got[out.req_id]
        got[out.req_id] = (
            tokens + out.new_token_ids,
            logprobs + [lp.logprob for lp in out.logprobs],
            out.num_cached_tokens,
        )
    return got


def run(engine: LLMEngine, prompt: list[int], max_tokens: int) -> Result:
    return run_all(engine, {"r": prompt}, max_tokens)["r"]


def assert_same(warm: Result, cold: Result, what: str) -> None:
    assert warm[0] == cold[0], f"{what}: tokens differ"
    err = np.abs(np.asarray(warm[1]) - np.asarray(cold[1])).max()
    assert err < LOGPROB_TOL, f"{what}: logprobs differ by {err}"


def check_next_turn_and_regenerate(
    make_runner: Callable[[], Any], vocab: int = 256, cold_runner: Any = None
) -> None:
    """A chat's next turn (prompt = last prompt + reply + new message) and a regenerated answer reuse
    the checkpointed prefix and equal a cold run (on `cold_runner`, default another of `make_runner`'s);
    with the restore skipped they would not."""
    rng = np.random.default_rng(5)
    first = [int(t) for t in rng.integers(3, vocab, size=41)]
    warm_engine = hybrid_engine(make_runner())
    cold_engine = hybrid_engine(cold_runner or make_runner(), enable_prefix_caching=False)
    one = run(warm_engine, first, 30)
    assert one[2] == 0
    assert_same(one, run(cold_engine, first, 30), "first turn")
    again = run(warm_engine, first, 30)  # regenerate: the prompt's checkpoint at its last block boundary
    assert again[2] == (len(first) - 1) // BLOCK * BLOCK == 32
    assert_same(again, one, "regenerated")
    second = first + one[0] + [int(t) for t in rng.integers(3, vocab, size=11)]
    warm = run(warm_engine, second, 12)
    assert warm[2] == (len(first) + 30 - 1) // BLOCK * BLOCK == 64  # the reply's tokens too
    cold = run(cold_engine, second, 12)
    assert_same(warm, cold, "next turn")
    stats = warm_engine.stats()
    assert stats.prefix_caching_enabled and stats.state_checkpoint_restores_total == 2
    # The check holds the restore to account: reusing the K/V with the state of another sequence (the
    # slot as the last request left it) gives other logits.
    checkpoints = warm_engine.scheduler.checkpoints
    assert checkpoints is not None
    checkpoints.restore = lambda block_hash, slot: None  # type: ignore[method-assign]
    skipped = run(warm_engine, second, 12)
    assert skipped[2] >= 64  # (now its own prompt checkpoint, at 80)
    assert np.abs(np.asarray(skipped[1]) - np.asarray(cold[1])).max() > 100 * LOGPROB_TOL


def check_preemption_and_eviction(make_runner: Callable[[], Any], vocab: int = 256) -> None:
    """Three chats, two turns, each turn asked twice, under a pool small enough to preempt and evict:
    every answer equals the same request run alone, cold."""
    rng = np.random.default_rng(7)
    chats = [[int(t) for t in rng.integers(3, vocab, size=n)] for n in (37, 50, 29)]
    engine = hybrid_engine(make_runner(), kv_cache_mib=1, max_num_seqs=4, state_checkpoints=3)
    cold_engine = hybrid_engine(make_runner(), enable_prefix_caching=False)
    asked: dict[str, tuple[list[int], Result]] = {}
    for turn in range(2):
        prompts = {f"c{i}t{turn}r{k}": chat for i, chat in enumerate(chats) for k in range(2)}
        got = run_all(engine, prompts, 24)
        for req_id, prompt in prompts.items():
            asked[req_id] = (prompt, got[req_id])
        chats = [chat + got[f"c{i}t{turn}r0"][0] + [5 + i, 9, 7] for i, chat in enumerate(chats)]
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats().state_checkpoint_restores_total > 0  # (re-admissions after preemption too)
    for req_id, (prompt, result) in asked.items():
        assert_same(result, run(cold_engine, prompt, 24), req_id)


def check_shared_prefix(make_runner: Callable[[], Any], vocab: int = 256, cold_runner: Any = None) -> None:
    """Three chats with the same 88-token prefix (five whole blocks, then 8 more tokens), each then its
    own: the second saves a checkpoint where it leaves the first's cached K/V, the third restores it
    (80 cached) with greedy tokens and logprobs equal to a cold run."""
    rng = np.random.default_rng(11)
    shared = [int(t) for t in rng.integers(3, vocab, size=88)]
    chats = [shared + [int(t) for t in rng.integers(3, vocab, size=20 + 3 * i)] for i in range(3)]
    warm_engine = hybrid_engine(make_runner())
    cold_engine = hybrid_engine(cold_runner or make_runner(), enable_prefix_caching=False)
    got = [run(warm_engine, chat, 8) for chat in chats]
    assert [cached for _, _, cached in got] == [0, 0, 80]
    for i, chat in enumerate(chats):
        assert_same(got[i], run(cold_engine, chat, 8), f"chat {i}")
    assert warm_engine.stats().state_checkpoint_restores_total == 1


def check_nested_prefixes(make_runner: Callable[[], Any], vocab: int = 256) -> None:
    """A system prompt (10 blocks), tool sets (5 blocks each), then each chat's own message. Two chats
    with different tool sets start together (64-token chunks: the second's cut lands on the first's
    first chunk); the next chat with the first tool set forks from the cache at the system prompt's end
    and at its tool set's end and saves both; a chat with a third tool set then restores the whole
    system prompt. Greedy tokens and logprobs equal cold runs."""
    rng = np.random.default_rng(13)

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, vocab, size=n)]

    system, tools = tokens(10 * BLOCK), [tokens(5 * BLOCK) for _ in range(3)]
    wave = {f"w{i}": system + tools[i] + tokens(20) for i in range(2)}
    warm_engine = hybrid_engine(make_runner(), prefill_chunk_size=64)
    cold_engine = hybrid_engine(make_runner(), enable_prefix_caching=False)
    got = run_all(warm_engine, wave, 8)
    for req_id, prompt in wave.items():
        assert_same(got[req_id], run(cold_engine, prompt, 8), req_id)
    again, third = system + tools[0] + tokens(23), system + tools[2] + tokens(17)
    warm = run(warm_engine, again, 8)
    assert warm[2] == 64  # the wave's cut
    assert_same(warm, run(cold_engine, again, 8), "same tools")
    warm = run(warm_engine, third, 8)
    assert warm[2] == len(system)  # saved by the chat before at the fork
    assert_same(warm, run(cold_engine, third, 8), "other tools")
