"""Fixed pool of KV-cache blocks with reference counts and prefix caching.

Full blocks are named by a chained hash (parent hash + the block's token ids). A freed block keeps its
content and hash in an LRU free list and is only evicted when handed out again, so a later request with
the same prefix can reuse it. Block 0 is the null block: never allocated, used to pad block tables.

Hand-out order: freed blocks without content, then never-used blocks while the touched part of the
pool is under the blocks in use plus a cache reserve (a quarter of the pool, at most 1 GiB), then the
least recently freed cached block. On CPU the pool is lazily committed memory, so a never-used block
costs RAM the first time it is written: the reserve bounds what the prefix cache adds to the working
set (a long-running server does not creep up to the whole pool), while another chat's request does not
evict this chat's cached turns as long as the reserve has room.

Partial reuse (`find_partial`): after the run of whole cached blocks, the prompt's next tokens may start
a cached block that follows the same prefix (the last block of the same prompt, which the
`num_tokens - 1` cap leaves out, or a sibling that shares its first tokens). The request then gets a
fresh block, the runner copies the first k slots of the cached block into it before the step's forward
(copy-on-write: the cached block stays shared and unchanged), and only the rest is computed. Candidates
are indexed by (parent hash, first token), so a lookup compares a handful of token tuples. A block named
in the step being scheduled is not a source: its K/V are written by that step's forward, after the copy.
Nothing needs pinning the source until the copy runs: every copy of a step runs before the forward
writes anything, and a block handed out in an earlier step is no longer named, so it is no candidate.
With `keep_tails` (the engine's pool), a freed request's last, partly filled block is a candidate too:
named by its computed tokens only (no hash: never a whole-block hit) and kept in the LRU order of cached
blocks, so a prompt repeated after a reply too short to fill that block still computes one token.
Pictures: a block keeps the (content hash, placeholder positions) of each picture with a placeholder in
it. A candidate follows the same prefix, so its positions are the prompt's: k stops where the tokens or
the pictures part, and never inside a picture (one that straddles the cut is copied whole or not at
all), so every copied slot holds the K/V of the same token, the same picture's same row.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass

from localchat.engine.request import Request

NULL_BLOCK_ID = 0

# A picture as a block remembers it: its content hash and every placeholder position (absolute).
Picture = tuple[str, tuple[int, ...]]


# Cached prefixes may keep a quarter of the pool, at most 1 GiB, in touched blocks beyond those in use.
CACHE_RESERVE_DIVISOR = 4
CACHE_RESERVE_BYTES = 2**30


@dataclass(slots=True)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    parent_hash: int | None = None
    token_ids: tuple[int, ...] | None = None  # checked on a hit: a hash match alone is not trusted
    image_hashes: tuple[str, ...] = ()  # pictures whose placeholders lie in the block, checked likewise
    pictures: tuple[Picture, ...] = ()  # the same pictures with their positions (partial reuse)
    named_in_step: int = -1  # the scheduler step that named it (its K/V are written by that step)

    def reset(self) -> None:
        self.ref_count = 0
        self.block_hash = self.parent_hash = self.token_ids = None
        self.image_hashes = ()
        self.pictures = ()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        keep_tails: bool = False,
        block_bytes: int = 0,
    ) -> None:
        """`block_bytes`: one block's K/V bytes, which caps the cache reserve at CACHE_RESERVE_BYTES."""
        assert num_blocks >= 2, "need the null block plus at least one usable block"
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.keep_tails = keep_tails and enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        reserve = self.num_usable_blocks // CACHE_RESERVE_DIVISOR
        self.cache_reserve_blocks = (
            min(reserve, CACHE_RESERVE_BYTES // block_bytes) if block_bytes else reserve
        )
        # Freed blocks only; head = next to hand out. Cached (hashed) blocks sit at the tail in LRU order.
        self.free_blocks: OrderedDict[int, None] = OrderedDict()
        # Ids 1..num_touched_blocks have been handed out at least once; the rest never were.
        self.num_touched_blocks = 0
        self.cached_blocks: dict[int, int] = {}  # block hash -> block id
        # (parent hash, first token id) -> named blocks: the candidates of a partial reuse
        self.children: dict[tuple[int | None, int], set[int]] = {}
        self.step = 0  # the scheduler's step count (end_step), to tell blocks named in this step
        self.kv_copies: list[tuple[int, int, int]] = []  # this step's (source, destination, tokens)
        self.prefix_queries = 0  # tokens of admitted requests that were looked up
        self.prefix_hits = 0  # of which came from the cache

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + self.num_usable_blocks - self.num_touched_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def get_computed_blocks(self, request: Request) -> list[int]:
        """Longest run of cached full blocks that prefixes the request, capped at num_tokens - 1 tokens
        so the last prompt token is always computed (its logits are needed)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        num_full = (request.num_tokens - 1) // self.block_size
        parent: int | None = None
        for index in range(num_full):
            block_hash, tokens, images = self._block_key(request, index, parent)
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent_hash != parent or block.image_hashes != images:
                break  # hash collision: treat as a miss
            hits.append(block_id)
            parent = block_hash
        return hits

    def find_partial(self, request: Request, hits: list[int]) -> tuple[int, int] | None:
        """(cached block, k): a named block that follows `hits` and whose first k tokens are the prompt's
        next k (k >= 1, the most found), keeping the last token to compute; None if there is none.
        With pictures on either side, k is cut where they part and before any picture it would split."""
        if not self.enable_prefix_caching:
            return None
        start = len(hits) * self.block_size
        limit = min(self.block_size, request.num_tokens - 1 - start)
        if limit <= 0:
            return None
        wanted = tuple(request.all_token_ids[start : start + limit])
        parent = self.blocks[hits[-1]].block_hash if hits else None
        mine = _pictures(request, start, start + limit)
        best: tuple[int, int] | None = None
        for block_id in self.children.get((parent, wanted[0]), ()):
            block = self.blocks[block_id]
            if block.named_in_step == self.step or block.token_ids is None:
                continue
            k = _common_prefix(block.token_ids, wanted)
            if mine or block.pictures:
                k = _picture_cut(start, k, mine, block.pictures)
            if k > 0 and (best is None or k > best[1]):
                best = (block_id, k)
        return best

    def end_step(self) -> list[tuple[int, int, int]]:
        """The scheduler's step is built: its copies (for the runner), and blocks named from now on are
        another step's."""
        copies, self.kv_copies = self.kv_copies, []
        self.step += 1
        return copies

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: list[int] | None = None,
        reserve: int = 0,
        num_lookahead: int = 0,
        partial: tuple[int, int] | None = None,
    ) -> list[int] | None:
        """Give `request` blocks for its computed tokens plus `num_new_tokens` more. Returns the newly
        allocated block ids, or None (and changes nothing) when the pool cannot cover it while keeping
        `reserve` blocks free. `computed_blocks` are prefix hits, only on a request's first allocation.
        `num_lookahead`: slots for speculative draft tokens after those; they get room but are never
        named in the prefix cache (they are not the request's tokens unless accepted).
        `partial` (find_partial's (source, k), with `request.num_computed_tokens` counting the k): the
        first new block gets the source's first k slots, copied by the runner (`kv_copies`)."""
        computed_blocks = computed_blocks or []
        assert not computed_blocks or not request.block_ids
        is_admission = not request.block_ids
        num_needed_total = -(
            -(request.num_computed_tokens + num_new_tokens + num_lookahead) // self.block_size
        )
        num_new_blocks = max(0, num_needed_total - len(request.block_ids) - len(computed_blocks))
        # Hits on free (ref 0) cached blocks take those blocks out of the free pool too.
        num_revived = sum(1 for b in computed_blocks if self.blocks[b].ref_count == 0)
        if num_new_blocks + num_revived > self.num_free_blocks - reserve:
            return None
        for block_id in computed_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_blocks[block_id]
            block.ref_count += 1
        new_ids = [self._pop_free_block() for _ in range(num_new_blocks)]
        request.block_ids.extend(computed_blocks)
        request.block_ids.extend(new_ids)
        if partial is not None:
            # If the source was the free block just handed out as the destination, the copy is onto
            # itself: its content is still there until the step's forward, which runs after the copy.
            self.kv_copies.append((partial[0], request.block_ids[len(computed_blocks)], partial[1]))
        if self.enable_prefix_caching and is_admission:
            # Counted here, not at lookup: an admission that then finds no room is retried next step.
            self.prefix_queries += request.num_tokens
            self.prefix_hits += len(computed_blocks) * self.block_size + (partial[1] if partial else 0)
        if self.enable_prefix_caching:
            # NOTE: blocks are registered now, before the step writes them. Safe: the runner writes every
            # layer's K/V before attending, and nothing reads the cache between schedule and execute.
            self._cache_full_blocks(request, request.num_computed_tokens + num_new_tokens)
        return new_ids

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so its last blocks are evicted before its first."""
        if self.enable_prefix_caching:
            self._adopt_orphaned_duplicates(request)
        if self.keep_tails:
            self._name_tail(request)
        for block_id in reversed(request.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                self.free_blocks[block_id] = None
                if block.token_ids is None:
                    self.free_blocks.move_to_end(block_id, last=False)  # no content worth keeping
        request.block_ids.clear()
        request.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        for block_id in self.free_blocks:
            self._uncache(self.blocks[block_id])

    def _pop_free_block(self) -> int:
        head = next(iter(self.free_blocks), None)
        untouched_left = self.num_touched_blocks < self.num_usable_blocks
        under_reserve = self.num_touched_blocks < self.num_used_blocks + self.cache_reserve_blocks
        if head is not None and (
            self.blocks[head].token_ids is None or not (untouched_left and under_reserve)
        ):
            block_id, _ = self.free_blocks.popitem(last=False)  # no content, or the reserve is full
        else:
            self.num_touched_blocks += 1
            block_id = self.num_touched_blocks
        block = self.blocks[block_id]
        self._uncache(block)  # lazy eviction
        block.ref_count, block.named_in_step = 1, -1  # its content is now whatever its new step writes
        return block_id

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is not None and self.cached_blocks.get(block.block_hash) == block.block_id:
            del self.cached_blocks[block.block_hash]
        if block.token_ids:
            siblings = self.children.get((block.parent_hash, block.token_ids[0]))
            if siblings is not None:
                siblings.discard(block.block_id)
                if not siblings:
                    del self.children[(block.parent_hash, block.token_ids[0])]
        block.reset()

    def _block_key(
        self, request: Request, index: int, parent: int | None
    ) -> tuple[int, tuple[int, ...], tuple[str, ...]]:
        """(hash, token ids, image hashes) of a full block. Image placeholders are the same token id for
        every picture, so the pictures' content hashes are folded in: another picture never reuses the
        block, the same picture does. Text-only blocks hash as before."""
        start = index * self.block_size
        tokens = tuple(request.all_token_ids[start : start + self.block_size])
        images = request.image_hashes_in(start, start + self.block_size) if request.images else ()
        block_hash = hash((parent, tokens, images)) if images else hash((parent, tokens))
        return block_hash, tokens, images

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        num_full = min(num_tokens // self.block_size, len(request.block_ids))
        for index in range(request.num_registered_blocks, num_full):
            parent = request.block_hashes[index - 1] if index else None
            block_hash, tokens, images = self._block_key(request, index, parent)
            if index == len(request.block_hashes):
                request.block_hashes.append(block_hash)
            request.num_registered_blocks = index + 1
            block = self.blocks[request.block_ids[index]]
            if block.block_hash is not None:
                continue  # already cached (a prefix hit)
            holder_id = self.cached_blocks.get(block_hash)
            if holder_id is not None:
                holder = self.blocks[holder_id]
                if holder.ref_count > 0:
                    # A running request holds the same content; free() re-checks later. Marked as this
                    # step's all the same: if the step fails, free() must not name it (forget_unwritten).
                    block.named_in_step = self.step
                    continue
                # The cached copy is idle and would be evicted while this live copy stays unnamed, which
                # broke the chain for every later block (a regenerated answer lost its cache). Name the
                # live copy instead and hand the idle one out first.
                self._uncache(holder)
                self.free_blocks.move_to_end(holder_id, last=False)
            pictures = _pictures(request, index * self.block_size, (index + 1) * self.block_size)
            self._register(block, block_hash, parent, tokens, images, pictures)
            block.named_in_step = self.step  # written by the step being scheduled: no copy source yet

    def forget_unwritten(self, requests: list[Request], step: int) -> None:
        """After `step` failed: unname the blocks it named (their K/V were never written), in each of the
        step's requests from the first such block on, so no later prompt hits them. Found for all requests
        before any is unnamed: a request admitted in the same step may hold another's as its hits."""
        cuts: list[tuple[Request, int]] = []
        for request in requests:
            registered = request.block_ids[: request.num_registered_blocks]
            first = next((i for i, b in enumerate(registered) if self.blocks[b].named_in_step == step), None)
            if first is not None:
                cuts.append((request, first))
        for request, first in cuts:
            for block_id in request.block_ids[first : request.num_registered_blocks]:
                block = self.blocks[block_id]
                if block.named_in_step == step:
                    ref_count = block.ref_count
                    self._uncache(block)
                    block.ref_count, block.named_in_step = ref_count, -1
            request.num_registered_blocks = first
            del request.block_hashes[first:]

    def unname(self, block_ids: set[int]) -> None:
        """Forget these blocks' names (their K/V are not to be trusted); whoever holds them keeps them."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            ref_count = block.ref_count
            self._uncache(block)
            block.ref_count, block.named_in_step = ref_count, -1

    def _name_tail(self, request: Request) -> None:
        """Name the request's partly filled last block by its computed tokens (a partial-reuse source).
        Only a block no other request holds, past every named block (a block named for a step whose
        output never came, an abort in flight, stays unnamed). Its pictures are kept with their positions,
        so a picture the computed tokens cut is never copied (find_partial)."""
        index, count = divmod(request.num_computed_tokens, self.block_size)
        if not count or index >= len(request.block_ids):
            return
        if index != request.num_registered_blocks or index > len(request.block_hashes):
            return
        block = self.blocks[request.block_ids[index]]
        if block.ref_count != 1 or block.token_ids is not None:
            return
        start = index * self.block_size
        block.token_ids = tuple(request.all_token_ids[start : start + count])
        block.pictures = _pictures(request, start, start + count)
        block.parent_hash = request.block_hashes[index - 1] if index else None
        self.children.setdefault((block.parent_hash, block.token_ids[0]), set()).add(block.block_id)

    def _adopt_orphaned_duplicates(self, request: Request) -> None:
        """Name this request's unnamed full blocks whose content no block names any more (the copy a
        concurrent twin held was evicted meanwhile), so the freed chain stays findable end to end."""
        num_full = min(request.num_registered_blocks, len(request.block_hashes))
        for index in range(num_full):
            block = self.blocks[request.block_ids[index]]
            block_hash = request.block_hashes[index]
            if block.block_hash is not None or block_hash in self.cached_blocks:
                continue
            parent = request.block_hashes[index - 1] if index else None
            _, tokens, images = self._block_key(request, index, parent)
            pictures = _pictures(request, index * self.block_size, (index + 1) * self.block_size)
            self._register(block, block_hash, parent, tokens, images, pictures)

    def _register(
        self,
        block: KVBlock,
        block_hash: int,
        parent: int | None,
        tokens: tuple[int, ...],
        images: tuple[str, ...] = (),
        pictures: tuple[Picture, ...] = (),
    ) -> None:
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent, tokens
        block.image_hashes, block.pictures = images, pictures
        self.cached_blocks[block_hash] = block.block_id
        if tokens:
            self.children.setdefault((parent, tokens[0]), set()).add(block.block_id)


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _pictures(request: Request, start: int, end: int) -> tuple[Picture, ...]:
    """The request's pictures with a placeholder in positions [start, end). Placeholders are in prompt
    order (found scanning the prompt), so a bisection finds the first at or after `start`."""
    out: list[Picture] = []
    for image in request.images:
        places = image.placeholders
        i = bisect_left(places, start)
        if i < len(places) and places[i] < end:
            out.append((image.content_hash, places))
    return tuple(out)


def _picture_cut(start: int, k: int, mine: tuple[Picture, ...], theirs: tuple[Picture, ...]) -> int:
    """How many of the k token-equal positions from `start` also hold the same pictures' same rows: cut
    before the first placeholder of a picture only one side has there, and before any picture that
    straddles the cut (it is matched whole or not at all). Repeated until nothing moves the cut."""
    shared = set(mine) & set(theirs)
    pictures = set(mine) | set(theirs)
    while True:
        end = start + k
        cut = end
        for picture in pictures:
            first, last = picture[1][0], picture[1][-1]  # placeholders are in prompt order
            if picture not in shared:
                # Not the same picture at the same positions on both sides: none of its rows is copied
                # (one that began before `start` leaves nothing to copy).
                cut = min(cut, max(first, start))
            elif first < end <= last:
                cut = min(cut, first)
        if cut >= end:
            return k
        k = max(cut - start, 0)
        if k == 0:
            return 0
