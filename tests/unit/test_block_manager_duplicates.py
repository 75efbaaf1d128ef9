"""Prefix cache with duplicate content: a request that fills blocks with tokens some other block already
holds (a regenerated answer, identical concurrent requests, a preempted twin) must leave every full block
of the shared text findable, so the next turn hits the whole chain."""

from __future__ import annotations

from localchat.engine.block_manager import BlockManager
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams

BS = 4
PROMPT = list(range(100, 118))  # 18 tokens: 4 full blocks + 2
ANSWER = list(range(500, 530))  # 30 tokens, what greedy decoding "answers" every time


def admit(bm: BlockManager, req: Request) -> None:
    hits = bm.get_computed_blocks(req)
    req.num_computed_tokens = len(hits) * BS
    assert bm.allocate_slots(req, req.num_tokens - req.num_computed_tokens, hits) is not None
    req.num_computed_tokens = req.num_tokens


def decode(bm: BlockManager, req: Request, tokens: list[int]) -> None:
    """One token per step, as the scheduler does: the new token's slot is allocated, then computed."""
    for token in tokens:
        req.append_output_token(token)
        assert bm.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1


def cached_tokens(bm: BlockManager, tokens: list[int]) -> int:
    return len(bm.get_computed_blocks(Request("probe", tokens, SamplingParams(max_tokens=1)))) * BS


def second_turn() -> list[int]:
    return [*PROMPT, *ANSWER, 900, 901, 902, 903, 904, 905]  # 54 tokens: 13 full blocks + 2


def full_blocks(tokens: list[int]) -> int:
    return (len(tokens) - 1) // BS * BS  # what a perfect cache can give (the last token is computed)


def run_turn(bm: BlockManager, req_id: str, prompt: list[int], answer: list[int]) -> Request:
    req = Request(req_id, prompt, SamplingParams(max_tokens=len(answer)))
    admit(bm, req)
    decode(bm, req, answer)
    return req


def test_regenerate_then_continue_keeps_the_whole_chain_cached() -> None:
    # A small pool, so the regenerated answer's new blocks must come out of the idle cached ones.
    bm = BlockManager(num_blocks=20, block_size=BS)
    bm.free(run_turn(bm, "first", PROMPT, ANSWER))
    bm.free(run_turn(bm, "second", second_turn(), [950, 951]))
    assert cached_tokens(bm, second_turn()) == full_blocks(second_turn())
    bm.free(run_turn(bm, "regenerate", PROMPT, ANSWER))  # same prompt, same (greedy) answer
    assert cached_tokens(bm, second_turn()) == full_blocks(second_turn())
    bm.free(run_turn(bm, "second-again", second_turn(), [950, 951]))
    assert cached_tokens(bm, second_turn()) == full_blocks(second_turn())
    assert bm.num_used_blocks == 0


def test_identical_concurrent_requests_leave_the_chain_cached_whoever_finishes_first() -> None:
    for first_done in ("a", "b"):
        bm = BlockManager(num_blocks=26, block_size=BS)
        a = Request("a", PROMPT, SamplingParams(max_tokens=len(ANSWER)))
        b = Request("b", PROMPT, SamplingParams(max_tokens=len(ANSWER)))
        admit(bm, a)
        admit(bm, b)  # hits a's prompt blocks
        for token in ANSWER:  # decoded in lockstep: b's answer blocks duplicate a's
            decode(bm, a, [token])
            decode(bm, b, [token])
        done, other = (a, b) if first_done == "a" else (b, a)
        bm.free(done)
        # The survivor keeps growing, taking idle blocks (and evicting the finished twin's copies).
        decode(bm, other, [700 + i for i in range(12)])
        bm.free(other)
        assert cached_tokens(bm, second_turn()) == len(PROMPT + ANSWER), first_done  # all 12 blocks
        assert len(set(bm.cached_blocks.values())) == len(bm.cached_blocks)  # one block per hash
        assert bm.num_used_blocks == 0


def test_preempted_request_with_duplicates_is_readmitted_from_the_cache() -> None:
    bm = BlockManager(num_blocks=30, block_size=BS)
    bm.free(run_turn(bm, "first", PROMPT, ANSWER))
    twin = Request("twin", PROMPT, SamplingParams(max_tokens=len(ANSWER)))
    admit(bm, twin)
    decode(bm, twin, ANSWER[:20])  # duplicates of "first"'s idle answer blocks
    bm.free(twin)  # recompute-style preemption: blocks go back, outputs stay on the request
    twin.num_computed_tokens = 0
    hits = bm.get_computed_blocks(twin)
    assert len(hits) * BS == full_blocks(twin.all_token_ids)  # everything but the last partial block
    admit(bm, twin)
    decode(bm, twin, ANSWER[20:])
    bm.free(twin)
    assert cached_tokens(bm, second_turn()) == len(PROMPT + ANSWER)
    assert bm.num_used_blocks == 0
