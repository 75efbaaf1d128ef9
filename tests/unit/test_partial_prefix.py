"""Partial prefix reuse in the block manager and scheduler, CPU-exact: which cached block a prompt's
remainder starts, how much of it is copied, hit-rate accounting, eviction from the candidate index, and
that a block named in the step being scheduled is never a copy source. The fake runner checks every
context it reads through the block tables, so a copy that went wrong fails the engine tests below."""

from __future__ import annotations

from localchat.engine.block_manager import BlockManager
from localchat.engine.config import EngineConfig
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.request import FinishReason, Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler
from tests.helpers.fake_engine import chat_prompt, drain, fake_engine

BS = 4


def make_request(req_id: str, tokens: list[int]) -> Request:
    return Request(req_id, tokens, SamplingParams(max_tokens=8))


def admit(bm: BlockManager, req: Request) -> list[int] | None:
    """What the scheduler does at admission: whole-block hits, then a partial one."""
    hits = bm.get_computed_blocks(req)
    partial = bm.find_partial(req, hits)
    req.num_computed_tokens = len(hits) * BS + (partial[1] if partial else 0)
    return bm.allocate_slots(req, req.num_tokens - req.num_computed_tokens, hits, partial=partial)


def test_a_repeated_prompt_copies_all_but_its_last_token() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)  # a full pool: no untouched block, no cache reserve
    a = make_request("a", list(range(12)))  # three full blocks: 1, 2, 3
    admit(bm, a)
    bm.end_step()
    bm.free(a)
    b = make_request("b", list(range(12)))
    hits = bm.get_computed_blocks(b)
    assert hits == [1, 2]  # the cap: token 11 must be computed
    assert bm.find_partial(b, hits) == (3, 3)
    assert admit(bm, b) is not None
    assert b.num_computed_tokens == 11
    # The freed source was the head of the free list, so it is its own destination: a copy onto itself,
    # and its content is there until the step's forward, which runs after the copies.
    assert b.block_ids == [1, 2, 3]
    assert bm.end_step() == [(3, 3, 3)]
    assert bm.end_step() == []  # handed over once
    assert bm.prefix_hits == 11 and bm.prefix_queries == 24


def test_with_room_in_the_pool_the_copy_goes_to_a_fresh_block_and_the_source_stays_cached() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = make_request("a", list(range(12)))
    admit(bm, a)
    bm.end_step()
    bm.free(a)
    b = make_request("b", list(range(12)))
    assert admit(bm, b) is not None and b.num_computed_tokens == 11
    assert b.block_ids == [1, 2, 4]
    assert bm.end_step() == [(3, 4, 3)]
    bm.free(b)
    assert (
        len(bm.get_computed_blocks(make_request("c", [*range(12), 99]))) == 3
    )  # the third block stayed cached


def test_a_source_held_by_a_running_request_stays_shared_and_unchanged() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = make_request("a", list(range(12)))
    admit(bm, a)
    bm.end_step()
    b = make_request("b", list(range(12)))
    admit(bm, b)
    assert b.block_ids[:2] == [1, 2] and b.block_ids[2] not in a.block_ids
    assert bm.end_step() == [(3, b.block_ids[2], 3)]
    assert bm.blocks[3].ref_count == 1 and bm.blocks[3].token_ids == (8, 9, 10, 11)  # a's, still named


def test_a_sibling_block_sharing_the_first_tokens_is_copied_up_to_where_they_part() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    admit(bm, make_request("a", [0, 1, 2, 3, 4, 5, 6, 7, 8]))
    bm.end_step()
    b = make_request("b", [0, 1, 2, 3, 4, 5, 9, 9, 9, 9])  # block 2 of a starts 4, 5 then parts
    assert bm.find_partial(b, bm.get_computed_blocks(b)) == (2, 2)
    c = make_request("c", [7, 1, 2, 3, 4, 5, 6])  # same tokens after another first block: no parent
    assert bm.find_partial(c, bm.get_computed_blocks(c)) is None
    d = make_request("d", [0, 1, 2, 3, 9, 5])  # the next block's first token differs
    assert bm.find_partial(d, bm.get_computed_blocks(d)) is None


def test_a_block_named_in_this_step_is_no_source_until_the_step_is_built() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    admit(bm, make_request("a", list(range(8))))
    b = make_request("b", list(range(8)))
    hits = bm.get_computed_blocks(b)
    assert hits == [1]  # a whole-block hit may read what this step writes (layers write, then attend)
    assert bm.find_partial(b, hits) is None  # a copy runs before the step: block 2 is not written yet
    bm.end_step()
    assert bm.find_partial(b, hits) == (2, 3)


def test_an_evicted_block_leaves_the_candidates() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)  # 3 usable blocks
    a = make_request("a", list(range(8)))
    admit(bm, a)
    bm.end_step()
    bm.free(a)
    assert {bm.blocks[i].token_ids for ids in bm.children.values() for i in ids} == {
        (0, 1, 2, 3),
        (4, 5, 6, 7),
    }
    admit(bm, make_request("x", list(range(100, 112))))  # takes every block: 1 and 2 are evicted
    b = make_request("b", list(range(8)))
    assert bm.get_computed_blocks(b) == [] and bm.find_partial(b, []) is None
    # Only x's blocks are candidates now, under x's own keys.
    assert {bm.blocks[i].token_ids for ids in bm.children.values() for i in ids} == {
        (100, 101, 102, 103),
        (104, 105, 106, 107),
        (108, 109, 110, 111),
    }
    assert (None, 0) not in bm.children


def test_prefix_caching_off_never_copies() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=False)
    admit(bm, make_request("a", list(range(12))))
    bm.end_step()
    b = make_request("b", list(range(12)))
    assert bm.find_partial(b, bm.get_computed_blocks(b)) is None


def test_scheduler_sends_the_copy_with_the_admission() -> None:
    s = Scheduler(EngineConfig(block_size=BS, watermark_fraction=0.0), BlockManager(16, BS))
    a = make_request("a", list(range(12)))
    s.add_request(a)
    out = s.schedule()
    assert out.kv_copies == [] and out.num_scheduled_tokens == {"a": 12}
    a.num_computed_tokens = 12
    s.finish_request(a, FinishReason.STOP)
    b = make_request("b", list(range(12)))
    s.add_request(b)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"b": 1}
    assert out.kv_copies == [(3, b.block_ids[2], 3)]
    assert out.scheduled_new_reqs[0].num_computed_tokens == 11 and b.num_cached_tokens == 11


def test_engine_repeats_and_regenerations_read_the_right_context() -> None:
    """Twin prompts in one step (the second may not copy from the first's unwritten blocks), then the
    same prompt again and a longer one sharing it: every reply as scripted, the fake runner's context
    check passes, and the repeat is served from the cache but for its last token."""
    engine = fake_engine(block_size=4)
    prompt = chat_prompt("<<say:partial reuse works>> " + "shared words " * 4)
    ids = [engine.add_request(prompt, SamplingParams(max_tokens=30)) for _ in range(2)]
    first_step_copies: list[list[tuple[int, int, int]]] = []
    inner = engine.runner.execute_model

    def recording(out: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        first_step_copies.append(list(batch.kv_copies))
        return inner(out, batch)

    engine.runner.execute_model = recording  # type: ignore[method-assign, assignment]
    texts = dict.fromkeys(ids, "")
    for out in drain(engine):
        texts[out.req_id] += out.text_delta
    assert set(texts.values()) == {"partial reuse works"}
    assert first_step_copies[0] == []
    again = engine.add_request(prompt, SamplingParams(max_tokens=30))
    longer = engine.add_request(prompt + chat_prompt("more"), SamplingParams(max_tokens=30))
    outs = {o.req_id: o for o in drain(engine) if o.finished}
    assert outs[again].num_cached_tokens == len(prompt) - 1
    assert outs[longer].num_cached_tokens >= len(prompt) - 1


def test_a_short_replys_partly_filled_last_block_is_a_source_too() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, keep_tails=True)  # full pool: the source is reused
    a = make_request("a", list(range(10)))  # blocks 1, 2 full; block 3 holds tokens 8, 9
    admit(bm, a)
    bm.end_step()
    a.num_computed_tokens = 10
    a.append_output_token(77)  # the reply's one token: never computed
    bm.free(a)
    assert bm.blocks[3].token_ids == (8, 9) and bm.blocks[3].block_hash is None
    assert list(bm.free_blocks) == [3, 2, 1]  # kept among the cached blocks, evicted first of them
    b = make_request("b", list(range(10)))
    hits = bm.get_computed_blocks(b)
    assert hits == [1, 2] and bm.find_partial(b, hits) == (3, 1)  # token 9 is the one computed
    c = make_request("c", [*range(10), 50, 51])  # a longer prompt through the same tokens
    assert bm.find_partial(c, bm.get_computed_blocks(c)) == (3, 2)
    admit(bm, c)
    # The tail was the free list's head: c's destination is the source itself, and once c's step is
    # scheduled the block is c's full block, named by its four tokens (no longer the 2-token tail).
    assert c.block_ids == [1, 2, 3] and bm.end_step() == [(3, 3, 2)]
    assert bm.blocks[3].token_ids == (8, 9, 50, 51) and bm.blocks[3].block_hash is not None


def test_without_keep_tails_or_past_a_named_block_no_tail_is_kept() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)  # the draft model's pool: no partial reuse there
    a = make_request("a", list(range(10)))
    admit(bm, a)
    a.num_computed_tokens = 10
    bm.free(a)
    assert bm.blocks[3].token_ids is None and next(iter(bm.free_blocks)) == 3
    bm = BlockManager(num_blocks=10, block_size=BS, keep_tails=True)
    a = make_request("a", list(range(10)))
    admit(bm, a)  # allocated for 10 tokens, but its step's output never came (an abort in flight)
    a.num_computed_tokens = 6  # block 2 was named for the step: its tail is no source
    bm.free(a)
    assert bm.blocks[2].token_ids == (4, 5, 6, 7)  # its whole-block name, not a tail of 4, 5
    assert all(b.token_ids is None for b in bm.blocks[3:])
