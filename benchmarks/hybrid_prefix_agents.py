"""Prefill tokens a hybrid model computes under agent and chat workloads, by checkpoint policy
(engine/state_checkpoints.py, engine/hybrid_prefix.py), on the fake backend's hybrid mode: counts, not
timings, so it runs anywhere in seconds and the numbers do not depend on the box.

Agents: waves of `--conc` new agents, each with the same system prompt and one of three tool sets, then
three turns (reply, a tool result, the next turn). Chats: one user's chats round-robin, some answers
regenerated. Columns: plain LRU eviction, one shared-prefix cut per admission (ranked eviction), and
the engine as it is (ranked eviction, a cut at every fork of the cached run).

python benchmarks/hybrid_prefix_agents.py
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localchat.backends.fake import EOS_ID, FakeRunner, FakeTokenizer
from localchat.engine import hybrid_prefix
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.state_checkpoints import StateCheckpoints

TOKENIZER = FakeTokenizer()
SYSTEM = "You are a careful agent. " + "Rules: be brief, cite files. " * 12
TOOLS = [
    "\n# Tools\n"
    + "".join(f"{{'name': '{name}{i}', 'description': 'does {name} things'}}\n" for i in range(6))
    for name in ("search", "edit", "shell")
]


def encode(text: str) -> list[int]:
    return TOKENIZER.encode(text)


def message(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def engine(rows: int, seqs: int, chunk: int) -> LLMEngine:
    config = EngineConfig(
        kv_cache_mib=8, block_size=16, max_num_seqs=seqs, prefill_chunk_size=chunk, state_checkpoints=rows
    )
    runner = FakeRunner(kv_bytes_per_token=128, state_bytes=1024)
    return LLMEngine(runner, TOKENIZER, config, eos_token_ids=[EOS_ID], model_max_len=8192)


TOTAL = [0]  # prompt tokens asked (the same under every policy)


def run_together(built: LLMEngine, prompts: dict[str, list[int]]) -> dict[str, tuple[list[int], int]]:
    """request id -> (output, prompt tokens computed)."""
    params = SamplingParams(max_tokens=64, temperature=0.0)
    for req_id, prompt in prompts.items():
        built.add_request(prompt, params, req_id=req_id)
        TOTAL[0] += len(prompt)
    got: dict[str, list[int]] = {r: [] for r in prompts}
    cached: dict[str, int] = {}
    while built.has_unfinished:
        for out in built.step():
            got[out.req_id] += out.new_token_ids
            cached[out.req_id] = out.num_cached_tokens
    return {r: (got[r], len(prompts[r]) - cached[r]) for r in prompts}


def agents(seed: int, conc: int, rows: int = 8, chunk: int = 512, count: int = 24) -> int:
    rng = random.Random(seed)
    built = engine(rows, 4, chunk)
    computed = 0
    for first in range(0, count, conc):
        chats = {
            a: encode(message("system", SYSTEM + TOOLS[rng.randrange(3)]))
            + encode(message("user", f"<<say:step result for agent {a} {'x' * 20}>> task {a}"))
            for a in range(first, min(first + conc, count))
        }
        for turn in range(3):
            got = run_together(built, {f"a{a}t{turn}": chat for a, chat in chats.items()})
            for a in chats:
                output, done = got[f"a{a}t{turn}"]
                computed += done
                chats[a] += output + encode("\n" + message("tool", f"result {turn} {'r' * 30}"))
    return computed


def chats(seed: int, count: int = 6, regenerate: float = 0.3, rows: int = 8) -> int:
    rng = random.Random(seed)
    built = engine(rows, 4, 512)
    convs = [
        encode(message("system", "You are helpful."))
        + encode(
            message(
                "user", f"<<say:answer {c} {'y' * rng.randrange(20, 90)}>> hi {'q' * rng.randrange(20, 200)}"
            )
        )
        for c in range(count)
    ]
    computed = 0
    for turn in range(5):
        for c in rng.sample(range(count), count):
            for _ in range(2 if rng.random() < regenerate else 1):
                output, done = run_together(built, {"r": convs[c]})["r"]
                computed += done
            convs[c] += output + encode("\n" + message("user", f"turn {turn} {'u' * rng.randrange(10, 80)}"))
    return computed


def plain_lru(self: StateCheckpoints) -> int | None:
    """The eviction before ranks: stale first, then the least recently used unowned checkpoint."""
    if self._free:
        return self._free.pop()
    unowned = [h for h, c in self._index.items() if c.owner is None]
    if not unowned:
        return None
    self._drop(next((h for h in unowned if not self._is_cached(h)), unowned[0]))
    return self._free.pop()


@contextmanager
def policy(name: str) -> Iterator[None]:
    take, cuts = StateCheckpoints._take, hybrid_prefix.MAX_SHARED_CUTS
    if name != "now":
        hybrid_prefix.MAX_SHARED_CUTS = 1  # the run's end only
    if name == "lru":
        StateCheckpoints._take = plain_lru  # type: ignore[method-assign]
    try:
        yield
    finally:
        StateCheckpoints._take, hybrid_prefix.MAX_SHARED_CUTS = take, cuts  # type: ignore[method-assign]


def main() -> None:
    workloads: list[tuple[str, Callable[[], int]]] = [
        ("agents, 4 at a time", lambda: agents(0, 4)),
        ("agents, 1 at a time", lambda: agents(0, 1)),
        ("agents, 2 at a time", lambda: agents(2, 2)),
        ("agents, 3 at a time", lambda: agents(3, 3)),
        ("agents, 8 at a time", lambda: agents(0, 8)),
        ("agents, 8 at a time, 16 rows", lambda: agents(0, 8, rows=16)),
        ("agents, 2 at a time, 4 rows", lambda: agents(1, 2, rows=4)),
        ("agents, unchunked", lambda: agents(5, 4, chunk=0)),
        ("chats, 6, 30% regenerated", lambda: chats(0)),
        ("chats, 10", lambda: chats(1, count=10)),
        ("chats, 6, 4 rows", lambda: chats(2, rows=4)),
        ("chats, 8, 60% regenerated", lambda: chats(3, count=8, regenerate=0.6)),
    ]
    print("| workload | prompt tokens | plain LRU | ranked, one cut | ranked, fork cuts (now) |")
    print("|---|---|---|---|---|")
    for name, workload in workloads:
        counts = []
        for which in ("lru", "one", "now"):
            TOTAL[0] = 0
            with policy(which):
                counts.append(workload())
        print(f"| {name} | {TOTAL[0]} | " + " | ".join(str(c) for c in counts) + " |")


if __name__ == "__main__":
    main()
