"""Block manager, CPU-exact: block ids, ref counts, free-list order, prefix hits and eviction."""

from __future__ import annotations

from localchat.engine.block_manager import BlockManager
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams

BS = 4


def make_request(req_id: str, tokens: list[int]) -> Request:
    return Request(req_id, tokens, SamplingParams(max_tokens=8))


def allocate_prompt(bm: BlockManager, req: Request) -> list[int] | None:
    hits = bm.get_computed_blocks(req)
    req.num_computed_tokens = len(hits) * BS
    return bm.allocate_slots(req, req.num_tokens - req.num_computed_tokens, hits)


def free_order(bm: BlockManager) -> list[int]:
    """Every free block in hand-out order: freed ones first, then those never handed out."""
    return [*bm.free_blocks, *range(bm.num_touched_blocks + 1, bm.num_blocks)]


def test_fresh_pool_hands_out_blocks_in_order_and_never_the_null_block() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    assert free_order(bm) == [1, 2, 3, 4, 5]
    req = make_request("a", list(range(10)))  # 10 tokens -> 3 blocks
    assert allocate_prompt(bm, req) == [1, 2, 3]
    assert req.block_ids == [1, 2, 3]
    assert [bm.blocks[i].ref_count for i in range(6)] == [0, 1, 1, 1, 0, 0]
    assert free_order(bm) == [4, 5]
    assert bm.num_used_blocks == 3


def test_full_blocks_are_hashed_partial_tail_is_not() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    req = make_request("a", list(range(10)))
    allocate_prompt(bm, req)
    assert bm.blocks[1].token_ids == (0, 1, 2, 3)
    assert bm.blocks[2].token_ids == (4, 5, 6, 7)
    assert bm.blocks[3].block_hash is None
    assert len(bm.cached_blocks) == 2
    assert bm.blocks[2].parent_hash == bm.blocks[1].block_hash


def test_free_puts_tail_first_and_uncached_blocks_at_the_head() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    req = make_request("a", list(range(10)))
    allocate_prompt(bm, req)
    bm.free(req)
    assert req.block_ids == []
    # Uncached tail block 3 goes to the head (reused first); cached 2 then 1 follow in LRU order; the
    # never-used 4 and 5 come last.
    assert free_order(bm) == [3, 2, 1, 4, 5]
    assert all(bm.blocks[i].ref_count == 0 for i in range(1, 6))
    assert len(bm.cached_blocks) == 2  # content kept for later hits


def test_prefix_hit_reuses_blocks_and_bumps_ref_counts() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_request("a", list(range(10)))
    allocate_prompt(bm, a)
    b = make_request("b", [*range(8), 100, 101, 102])
    hits = bm.get_computed_blocks(b)
    assert hits == [1, 2]
    b.num_computed_tokens = 8
    assert bm.allocate_slots(b, 3, hits) == [4]
    assert b.block_ids == [1, 2, 4]
    assert bm.blocks[1].ref_count == 2 and bm.blocks[2].ref_count == 2
    assert bm.prefix_hits == 8


def test_hit_on_freed_cached_blocks_takes_them_out_of_the_free_list() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    a = make_request("a", list(range(10)))
    allocate_prompt(bm, a)
    bm.free(a)
    b = make_request("b", list(range(9)))
    assert allocate_prompt(bm, b) == [3]  # hits 1, 2; new block from the head of the free list
    assert b.block_ids == [1, 2, 3]
    assert free_order(bm) == [4, 5]
    assert bm.blocks[1].ref_count == 1


def test_hit_is_capped_so_the_last_prompt_token_is_computed() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    a = make_request("a", list(range(8)))  # exactly two full blocks
    allocate_prompt(bm, a)
    b = make_request("b", list(range(8)))
    assert bm.get_computed_blocks(b) == [1]  # not [1, 2]: token 7 must be recomputed for its logits


def test_different_prefix_same_block_tokens_is_not_a_hit() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    allocate_prompt(bm, make_request("a", [0, 1, 2, 3, 4, 5, 6, 7, 9]))
    b = make_request("b", [9, 9, 9, 9, 4, 5, 6, 7, 9])  # second block equal, first differs
    assert bm.get_computed_blocks(b) == []


def test_eviction_is_lazy_and_lru_and_comes_before_touching_a_new_block() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)  # usable blocks 1..5
    a = make_request("a", [*list(range(8)), 50])
    allocate_prompt(bm, a)  # blocks 1, 2 cached; 3 partial
    b = make_request("b", [60, 61, 62, 63, 64])
    allocate_prompt(bm, b)  # blocks 4 (cached), 5
    bm.free(b)
    bm.free(a)
    assert free_order(bm) == [3, 5, 4, 2, 1]
    c = make_request("c", [70 + i for i in range(9)])  # 3 blocks: takes 3, 5, then evicts 4 (b's, older)
    assert allocate_prompt(bm, c) == [3, 5, 4]
    assert bm.blocks[3].token_ids == (70, 71, 72, 73)
    assert bm.blocks[5].token_ids == (74, 75, 76, 77)  # re-cached with c's content
    assert bm.blocks[4].block_hash is None  # evicted; now c's partial tail
    # b's cached content is gone, a's (more recently freed) still hits.
    assert bm.get_computed_blocks(make_request("b2", [60, 61, 62, 63, 64])) == []
    assert bm.get_computed_blocks(make_request("a2", [*list(range(8)), 50])) == [1, 2]


def test_a_steady_load_touches_at_most_its_working_set_plus_the_cache_reserve() -> None:
    # On CPU the pool's pages become resident when first written: a server that keeps serving a steady
    # load must stop touching new blocks once the prefix cache fills its reserve, not walk the whole pool.
    bm = BlockManager(num_blocks=100, block_size=BS)
    touched_after = []
    for round_ in range(50):
        live = [
            make_request(f"{round_}-{i}", [1000 * round_ + 10 * i + t for t in range(9)]) for i in range(3)
        ]
        for req in live:
            assert allocate_prompt(bm, req) is not None
        for req in live:
            bm.free(req)
        touched_after.append(bm.num_touched_blocks)
    assert bm.cache_reserve_blocks == 24  # a quarter of 99 (no byte cap without block_bytes)
    assert touched_after[-1] <= 9 + 24  # three requests of three blocks at a time, plus the reserve
    assert touched_after[20] == touched_after[-1]  # and it stays there
    assert bm.num_free_blocks == 99 and bm.num_used_blocks == 0


def test_another_chat_does_not_evict_a_cached_chat_while_the_reserve_has_room() -> None:
    bm = BlockManager(num_blocks=100, block_size=BS)
    chat_a = make_request("a", list(range(21)))  # 5 whole blocks + 1 token
    allocate_prompt(bm, chat_a)
    bm.free(chat_a)
    for i in range(3):  # three short requests of other chats come and go
        other = make_request(f"b{i}", [500 + 10 * i + t for t in range(6)])
        allocate_prompt(bm, other)
        bm.free(other)
    assert len(bm.get_computed_blocks(make_request("a2", [*range(21), 99]))) == 5


def test_cached_blocks_are_evicted_least_recently_freed_first_once_the_reserve_is_full() -> None:
    bm = BlockManager(num_blocks=9, block_size=BS)  # 8 usable, reserve 2
    a = make_request("a", list(range(13)))  # 4 blocks
    allocate_prompt(bm, a)
    bm.free(a)
    b = make_request("b", [100 + t for t in range(9)])  # 3 blocks
    allocate_prompt(bm, b)
    # a's content-less tail first; then 3 cached blocks would exceed the reserve of 2, so the least
    # recently freed (a's last whole blocks: freed tail first) are evicted and no new block is touched.
    assert bm.num_touched_blocks == 4
    assert bm.get_computed_blocks(make_request("a2", [*range(13), 99])) == [1]


def test_allocate_returns_none_and_changes_nothing_when_out_of_blocks() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)  # 3 usable
    a = make_request("a", list(range(9)))
    assert allocate_prompt(bm, a) == [1, 2, 3]
    b = make_request("b", [200, 201])
    before = (free_order(bm), [blk.ref_count for blk in bm.blocks])
    assert bm.allocate_slots(b, 2) is None
    assert (free_order(bm), [blk.ref_count for blk in bm.blocks]) == before
    assert b.block_ids == []


def test_reserve_keeps_blocks_back_for_admission() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = make_request("a", [1, 2])
    assert bm.allocate_slots(a, 2, reserve=3) is None
    assert bm.allocate_slots(a, 2, reserve=2) == [1]


def test_decode_growth_allocates_a_block_only_at_a_boundary() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    req = make_request("a", [1, 2, 3])
    allocate_prompt(bm, req)
    req.num_computed_tokens = 3
    req.append_output_token(4)
    assert bm.allocate_slots(req, 1) == []  # position 3 still fits block 1
    req.num_computed_tokens = 4
    req.append_output_token(5)
    assert bm.allocate_slots(req, 1) == [2]
    assert bm.blocks[1].token_ids == (1, 2, 3, 4)  # block 1 became full and is now cached


def test_shared_block_survives_until_last_owner_frees_it() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_request("a", list(range(9)))
    allocate_prompt(bm, a)
    b = make_request("b", list(range(9)))
    allocate_prompt(bm, b)
    assert b.block_ids[:2] == [1, 2]
    bm.free(a)
    assert 1 not in bm.free_blocks and bm.blocks[1].ref_count == 1
    bm.free(b)
    assert bm.blocks[1].ref_count == 0 and 1 in bm.free_blocks
    assert bm.num_used_blocks == 0


def test_disabled_prefix_caching_never_hits() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    allocate_prompt(bm, make_request("a", list(range(9))))
    assert bm.get_computed_blocks(make_request("b", list(range(9)))) == []
    assert bm.cached_blocks == {}


def test_prefix_hit_rate_counts_only_admissions_that_got_their_blocks() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    a = make_request("a", list(range(10)))  # blocks 1-3; 1 and 2 are full and cached
    allocate_prompt(bm, a)
    filler = make_request("f", list(range(100, 108)))  # blocks 4-5: the pool is now empty
    allocate_prompt(bm, filler)
    b = make_request("b", [*range(8), *range(200, 206)])  # 2 hits, needs 2 more blocks: none free
    for _ in range(5):  # the scheduler retries a waiting request every step
        assert allocate_prompt(bm, b) is None
        b.num_computed_tokens = 0
    assert (bm.prefix_queries, bm.prefix_hits) == (18, 0)  # only a's and f's admissions so far
    bm.free(filler)
    assert allocate_prompt(bm, b) is not None
    assert (bm.prefix_queries, bm.prefix_hits) == (32, 8)
    assert bm.prefix_hit_rate == 8 / 32


def test_the_cache_reserve_is_capped_in_bytes() -> None:
    assert BlockManager(num_blocks=10_001, block_size=BS).cache_reserve_blocks == 2500
    bm = BlockManager(num_blocks=10_001, block_size=BS, block_bytes=2**20)  # 1 MiB blocks
    assert bm.cache_reserve_blocks == 1024  # 1 GiB
