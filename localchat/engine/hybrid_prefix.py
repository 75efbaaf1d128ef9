"""When the scheduler checkpoints a hybrid model's recurrent state (engine/state_checkpoints.py).

- At the prompt's last whole-block boundary (`prompt_boundary`, below its last token, which is always
  computed): the prefill chunk that would cross it stops there, and the next step saves the state before
  its forward. A regenerated answer or an edited last message starts from there.
- At every block boundary a sequence's processed tokens reach past its prompt (decode steps, or the
  chunks recomputing a preempted one): the sequence's own checkpoint moves there, and when it ends (its
  last sampled token is never processed) that state is kept. The next turn of a chat, whose prompt is
  this prompt + this reply + a new message, starts from there.
- Where an admitted prompt's cached K/V run ends past its longest checkpoint (`note_shared_boundary`):
  the blocks are there (an earlier prompt computed them) but not the state, so the prompt shares a prefix
  with an earlier one (a system prompt, an agent's tool schemas) and diverges from it right after. Its
  prefill is cut there once and the state saved, so the next prompt sharing that prefix restores it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localchat.engine.config import EngineConfig
from localchat.engine.request import FinishReason, Request, RequestStatus

if TYPE_CHECKING:
    from localchat.engine.scheduler import Scheduler


def prompt_boundary(request: Request, block_size: int) -> int:
    return (request.num_prompt_tokens - 1) // block_size * block_size


# The fewest cached blocks past the restored boundary worth a shared-prefix checkpoint: it costs one more
# prefill step (about a decode step) and a checkpoint row (out of 8 by default, LRU: it may push out a
# chat's), and saves later prompts re-prefilling those blocks. At 4 blocks (64 tokens at 16 per block)
# that is ~300 ms of prefill on the 2-vCPU 2B-shape runs (~200 tokens/s) against a ~30 ms step; a block
# or two (typically a chat template's header, which nearly every chat shares) would spend a row on a
# few tens of ms.
MIN_SHARED_BLOCKS = 4


# The most shared-prefix cuts one admission takes (each one more prefill step and a checkpoint row):
# a system prompt, then its tool schemas, then one more level (few-shot examples) in agent clients.
MAX_SHARED_CUTS = 3


def note_shared_boundary(scheduler: Scheduler, request: Request, num_hits: int, num_reused: int) -> None:
    """At admission: the prompt's first `num_hits` blocks are cached but only `num_reused` end at a
    checkpoint. Its prefill will stop and save the state (`checkpoint_cut`, `save_checkpoint`) where
    the cached run ends (it leaves the prefix an earlier prompt computed there) and at every point
    inside the run where some other cached prompt left it (`branch_points`: a system prompt that
    prompts with different tool schemas share), each at least MIN_SHARED_BLOCKS past the last state
    kept, below the prompt's own boundary (saved anyway), at most MAX_SHARED_CUTS of them."""
    checkpoints = scheduler.checkpoints
    assert checkpoints is not None
    checkpoints.shared_cuts.pop(request.req_id, None)  # (from an admission that found no room)
    block_size = scheduler.block_size
    below = prompt_boundary(request, block_size) // block_size
    candidates = [num_hits]
    if num_hits - num_reused > MIN_SHARED_BLOCKS:  # room for a cut inside the run
        candidates = branch_points(scheduler, request, num_reused + MIN_SHARED_BLOCKS, num_hits) + candidates
    cuts: list[int] = []
    last = num_reused
    for count in candidates:
        if count - last >= MIN_SHARED_BLOCKS and count < below:
            cuts.append(count * block_size)
            last = count
    if len(cuts) > MAX_SHARED_CUTS:  # keep the outermost prefixes and the run's end
        cuts = cuts[: MAX_SHARED_CUTS - 1] + cuts[-1:]
    if cuts:
        checkpoints.shared_cuts[request.req_id] = tuple(cuts)


def branch_points(scheduler: Scheduler, request: Request, first: int, end: int) -> list[int]:
    """The block counts c in [first, end) where the prompt's cached run forks: the block ending at c has
    a cached child other than the prompt's own next block (nor a shorter tail of it), so another prompt
    shared the first c blocks and went on differently. One pass over the cache's children index; run
    only at admissions whose cached run passes their checkpoint by more than MIN_SHARED_BLOCKS."""
    manager = scheduler.block_manager
    hits = manager.get_computed_blocks(request)[:end]
    count_of = {manager.blocks[b].block_hash: c for c, b in enumerate(hits, 1) if c >= first}
    tokens = request.all_token_ids
    size = scheduler.block_size
    found: set[int] = set()
    for (parent, _), children in manager.children.items():
        count = count_of.get(parent)
        if count is None or count in found:
            continue
        own = tuple(tokens[count * size : (count + 1) * size])
        for child in children:
            theirs = manager.blocks[child].token_ids
            if theirs is not None and own[: len(theirs)] != theirs:
                found.add(count)
                break
    return sorted(found)


def checkpoint_cut(scheduler: Scheduler, request: Request, start: int, num_new: int) -> int:
    """`num_new` tokens from `start`, cut so that the chunk ends at the first checkpoint boundary it would
    cross: the shared-prefix ones noted at admission, if any, then the prompt's last whole block."""
    checkpoints = scheduler.checkpoints
    if checkpoints is None or request.sampling_params.embedding:
        return num_new
    shared = checkpoints.shared_cuts.get(request.req_id, ())
    for boundary in (*shared, prompt_boundary(request, scheduler.block_size)):
        if start < boundary < start + num_new:
            return boundary - start
    return num_new


def save_checkpoint(scheduler: Scheduler, request: Request) -> None:
    """Checkpoint the request's state if its processed tokens end at a block boundary worth keeping.
    Called while its step is scheduled (the copy runs before that step's forward) or when it ends."""
    checkpoints, pool = scheduler.checkpoints, scheduler.state_pool
    assert checkpoints is not None and pool is not None
    done = request.num_computed_tokens
    block_size = scheduler.block_size
    if done == 0 or done % block_size or request.sampling_params.embedding:
        return
    index = done // block_size - 1
    slot = pool.slots.get(request.req_id)
    if slot is None or index >= len(request.block_hashes):
        return  # (a block whose step failed was unnamed: forget_unwritten)
    shared = checkpoints.shared_cuts.get(request.req_id, ())
    if done in shared:
        checkpoints.save(request.block_hashes[index], done, slot, shared=True)
    elif done == prompt_boundary(request, block_size):
        checkpoints.save(request.block_hashes[index], done, slot, boundary=True)
    elif done >= request.num_prompt_tokens:
        checkpoints.save(request.block_hashes[index], done, slot, owner=request.req_id)


def finish_checkpoint(scheduler: Scheduler, request: Request, reason: FinishReason) -> None:
    """The request ends: keep the state of the tokens it processed (saved before its row is reused: the
    copy runs before the next step's forward) and hand its checkpoint to the LRU list. A failed step may
    have left its state half written: nothing is saved then."""
    assert scheduler.checkpoints is not None
    if reason != FinishReason.ERROR and request.status == RequestStatus.RUNNING:
        save_checkpoint(scheduler, request)
    scheduler.checkpoints.release(request.req_id)


def no_checkpoints_note(config: EngineConfig, steps_in_flight: object) -> str:
    """Why a hybrid model runs without prefix caching although it was asked for."""
    if config.state_checkpoints == 0:
        return "hybrid model with --state-checkpoints 0: no recurrent state is kept at block boundaries"
    if steps_in_flight != 1:
        return "hybrid model with steps in flight (--pp): state checkpoints are not ordered across stages"
    return "hybrid model: the memory budget holds no state checkpoint slot (raise --kv-cache-mib)"
