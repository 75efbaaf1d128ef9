"""Token-budget scheduler: every step hands `max_num_batched_tokens` out across running requests
(decodes and unfinished prefills, oldest first), then admits waiting ones, chunking prefills to fit.
Out of blocks, it preempts the newest running request (recompute later); nothing is dropped.
Hybrid models also need a state slot per running request (engine/state_slots.py): a request is admitted
only when a slot and its blocks are both free, and gives both back on finish or preemption.
With speculation on (engine/speculative.py), a decoding request may also get draft tokens after its
last one while few requests run; they take budget and block room but are never prefix-cached.
An admitted prompt reuses cached blocks: whole ones, then the first tokens of one more, copied into a
fresh block by the runner before the step (`SchedulerOutput.kv_copies`, engine/block_manager.py).
For models that attend over a picture's tokens both ways (`whole_pictures`), a chunk never cuts a picture's
run (vision/picture_runs.py): it stops before it, or takes all of it past the chunk size and budget.
With steps in flight (`--pp`, engine/in_flight.py) a step skips the requests of steps not yet back
(`in_flight`), takes at most `max_step_seqs` requests, and never preempts one in flight.
Hybrid models reuse cached blocks only up to a state checkpoint (engine/state_checkpoints.py,
`hybrid_prefix.py`): restored, saved at the prompt's last block boundary (its prefill chunk stops
there), where its cached K/V run passes its longest checkpoint (a prefix shared with an earlier prompt:
one more cut) and at every block boundary a running sequence's processed tokens reach."""

from __future__ import annotations

from collections import deque

from localchat.engine.block_manager import BlockManager
from localchat.engine.config import EngineConfig
from localchat.engine.hybrid_prefix import (
    checkpoint_cut,
    finish_checkpoint,
    note_shared_boundary,
    save_checkpoint,
)
from localchat.engine.hybrid_spec import SpecStateRows, save_passed_boundary
from localchat.engine.interface import CachedRequestData, NewRequestData, SchedulerOutput
from localchat.engine.request import FinishReason, Request, RequestStatus
from localchat.engine.speculative import NgramProposer, Proposer, draft_length, propose_safely
from localchat.engine.state_checkpoints import StateCheckpoints
from localchat.engine.state_slots import StateSlotPool
from localchat.vision.picture_runs import whole_picture_end


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager, state_pool: StateSlotPool | None = None
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.state_pool = state_pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_since_last_step: set[str] = set()
        self.num_preemptions = 0
        # The engine sets these: speculation may be off for the model or the runner (engine.py).
        self.speculate = config.speculative.enabled
        self.proposer: Proposer = NgramProposer(config.speculative)  # the engine may set a draft model's
        self.max_model_len = 0
        self.whole_pictures = False  # the engine sets it from the runner (`pictures_both_ways`)
        self.in_flight: set[str] = set()  # requests in a submitted step (engine/in_flight.py)
        self.max_step_seqs: int | None = None  # the most requests one step takes (None: no cap)
        self.checkpoints: StateCheckpoints | None = None  # hybrid prefix caching (the engine sets it)
        self.spec_rows: SpecStateRows | None = None  # hybrid models' verify states (engine/hybrid_spec.py)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        self.requests[request.req_id] = request
        self.waiting.append(request)

    def finish_request(self, request: Request, reason: FinishReason) -> None:
        if request.is_finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        if self.checkpoints is not None:
            finish_checkpoint(self, request, reason)
        self.block_manager.free(request)
        if self.state_pool is not None:
            self.state_pool.free(request.req_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self._finished_since_last_step.add(request.req_id)
        del self.requests[request.req_id]

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunk = self.config.prefill_chunk_size
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        preempted: set[str] = set()

        speculate = self.speculate and len(self.running) <= self.config.speculative.max_batch
        for request in self.running:
            request.spec_token_ids = []
        proposals = self._propose() if speculate else {}
        if self.spec_rows is not None:
            self.spec_rows.begin_step()
        index = 0
        cap = self.max_step_seqs or self.config.max_num_seqs
        while index < len(self.running) and budget > 0 and len(num_scheduled) < cap:
            request = self.running[index]
            if request.req_id in self.in_flight:
                index += 1
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if chunk:
                num_new = min(num_new, chunk)
            if self.checkpoints is not None:  # (a prompt's later chunks, or a preempted one's recompute)
                num_new = checkpoint_cut(self, request, request.num_computed_tokens, num_new)
            num_new = self._whole_pictures(request, request.num_computed_tokens, num_new)
            drafts = proposals.get(request.req_id, [])[: max(0, budget - 1)] if num_new == 1 else []
            if self.spec_rows is not None:  # a hybrid's verify row needs a spec row per draft
                drafts = drafts[: self.spec_rows.available]
            while (
                new_blocks := self.block_manager.allocate_slots(request, num_new, num_lookahead=len(drafts))
            ) is None:
                if drafts:
                    drafts = []  # no room to speculate: a plain decode step may still fit
                    continue
                victim = self.running.pop(self._victim(index))  # newest; not yet scheduled in this step
                self._preempt(victim)
                preempted.add(victim.req_id)
                if victim is request:
                    break
            if new_blocks is None:
                break
            request.spec_token_ids = drafts
            if self.spec_rows is not None and drafts:
                self.spec_rows.assign(request.req_id, len(drafts))
            if self.checkpoints is not None:
                save_passed_boundary(self, request)  # (a block boundary its last verify step passed)
                save_checkpoint(self, request)  # before this step's forward moves the state on
            num_scheduled[request.req_id] = num_new + len(drafts)
            cached_reqs.append(CachedRequestData(request.req_id, new_blocks, request.num_computed_tokens))
            budget -= num_new + len(drafts)
            index += 1

        while (
            self.waiting
            and not preempted
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
            and len(num_scheduled) < cap
        ):
            request = self.waiting[0]
            if self.state_pool is not None and self.state_pool.num_free == 0:
                break  # a hybrid model's request needs a state slot as well as blocks
            # Embedding requests pool every prompt token's hidden state: no cached prefix can stand in.
            embedding = request.sampling_params.embedding
            hits = [] if embedding else self.block_manager.get_computed_blocks(request)
            # The prompt's next tokens may start a cached block: copy that block's first k slots.
            partial = None
            if self.state_pool is not None:  # K/V only with the state after them (no partial blocks)
                reused = self._checkpointed(hits)
                if self.checkpoints is not None and not embedding:  # a shared prefix's end: save there
                    note_shared_boundary(self, request, len(hits), reused)
                hits = hits[:reused]
            elif not embedding:
                partial = self.block_manager.find_partial(request, hits)
            num_computed = len(hits) * self.block_manager.block_size + (partial[1] if partial else 0)
            num_new = request.num_tokens - num_computed
            if chunk:
                num_new = min(num_new, chunk, budget)
            elif num_new > budget and num_scheduled:
                break  # unchunked prefill: wait for a step it can have to itself
            if self.checkpoints is not None and not embedding:  # a picture's run still goes whole (below)
                num_new = checkpoint_cut(self, request, num_computed, num_new)
            num_new = self._whole_pictures(request, num_computed, num_new)
            request.num_computed_tokens = num_computed
            # Keep a watermark free for running requests to grow into; a lone request gets everything,
            # so any prompt under max_model_len (<= the pool) is always admitted eventually.
            reserve = self._watermark() if self.running else 0
            new_blocks = self.block_manager.allocate_slots(
                request, num_new, hits, reserve=reserve, partial=partial
            )
            if new_blocks is None:
                request.num_computed_tokens = 0
                break
            if self.state_pool is not None:
                slot = self.state_pool.allocate(request.req_id)
                if hits and self.checkpoints is not None and slot is not None:
                    self.checkpoints.restore(self.block_manager.blocks[hits[-1]].block_hash or 0, slot)
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_computed
            num_scheduled[request.req_id] = num_new
            budget -= num_new
            new_reqs.append(
                NewRequestData(
                    req_id=request.req_id,
                    prompt_token_ids=request.prompt_token_ids,
                    output_token_ids=list(request.output_token_ids),
                    sampling_params=request.sampling_params,
                    block_ids=list(request.block_ids),
                    num_computed_tokens=num_computed,
                )
            )

        finished = self._finished_since_last_step
        self._finished_since_last_step = set()
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=finished,
            preempted_req_ids=preempted,
            block_step=self.block_manager.step,
            kv_copies=self.block_manager.end_step(),
            state_copies=self._state_copies(bool(num_scheduled)),
        )

    def _victim(self, index: int) -> int:
        """The newest running request at `index` or after that is not in a step in flight (the one at
        `index`, being scheduled, is not)."""
        return next(
            i
            for i in range(len(self.running) - 1, index - 1, -1)
            if self.running[i].req_id not in self.in_flight
        )

    def start_checkpoints(self, first_slot: int, count: int) -> None:
        """Hybrid prefix caching: `count` checkpoint rows of the state pool from `first_slot` on."""
        cached = self.block_manager.cached_blocks
        self.checkpoints = StateCheckpoints(first_slot, count, cached.__contains__)

    def _state_copies(self, step_runs: bool) -> list[tuple[int, int]]:
        # An empty step never runs: its copies wait for the next one (a save at a request's end).
        # A verify step's state fix-ups (hybrid_spec.py) come first: a save may read their live rows.
        fixups = self.spec_rows.end_step(step_runs) if self.spec_rows is not None else []
        if not step_runs:
            return []
        return fixups + (self.checkpoints.end_step() if self.checkpoints is not None else [])

    @property
    def block_size(self) -> int:
        return self.block_manager.block_size

    def _checkpointed(self, hits: list[int]) -> int:
        """How many leading blocks of `hits` a hybrid request may reuse: up to a state checkpoint."""
        if self.checkpoints is None or not hits:
            return 0
        hashes = [self.block_manager.blocks[b].block_hash or 0 for b in hits]
        return self.checkpoints.longest(hashes, self.block_size)

    def _whole_pictures(self, request: Request, start: int, num_new: int) -> int:
        if not self.whole_pictures or not request.images:
            return num_new
        return whole_picture_end(request.images, start, start + num_new) - start

    def _propose(self) -> dict[str, list[int]]:
        """Draft tokens for the decoding requests that may speculate this step, asked of the proposer
        all at once; each capped so that none can pass max_tokens or the context."""
        wanted: list[tuple[Request, int]] = []
        for request in self.running:
            if request.num_tokens - request.num_computed_tokens != 1 or request.matcher is not None:
                continue  # a grammar would have to be advanced over guesses: not done
            if request.spec_pause > 0:
                request.spec_pause -= 1  # its recent drafts all failed (speculative.pause_after)
                continue
            k = min(
                draft_length(request, self.config.speculative.num_tokens),  # adapted per sequence
                request.sampling_params.max_tokens - request.num_output_tokens - 1,
                self.max_model_len - request.num_tokens - 1,
            )
            if k > 0:
                wanted.append((request, k))
        return propose_safely(self.proposer, wanted, set(self.requests)) if wanted else {}

    def _watermark(self) -> int:
        return int(self.block_manager.num_usable_blocks * self.config.watermark_fraction)

    def _preempt(self, request: Request) -> None:
        """Recompute-style preemption: drop its KV (cached blocks stay findable) and queue it first."""
        if self.checkpoints is not None:
            self.checkpoints.release(request.req_id)  # its checkpoint stays: re-admission may restore it
        self.block_manager.free(request)
        if self.state_pool is not None:
            self.state_pool.free(request.req_id)  # recompute: the state is rebuilt from the tokens
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
