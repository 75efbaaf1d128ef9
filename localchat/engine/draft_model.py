"""The draft-model proposer (`--speculative draft`): a small model with the target's vocabulary guesses
k tokens per speculating sequence, greedily, batched across sequences, before the target's step scores
them (engine/speculative.py has the acceptance rule; a greedy draft is a one-hot q, so the rule stays
exact for sampled rows too).

The draft has its own runner (same backend, its own weights) and its own small paged KV cache, with its
own BlockManager. Each target sequence has a shadow request here holding the same committed tokens.
Per step, for every sequence that speculates:
  pass 1: the shadow's missing tokens (a prompt, or the one to three tokens the target committed last
          step), ending with the last committed token: the draft's token after it is draft 1;
  pass j: draft j-1 alone at the next position: draft j.
Draft tokens fed in passes 2..k sit in the shadow's KV after its committed tokens, like the target's
drafts: never prefix-cached, and kept next step only as far as the target accepted them (the shadow's
computed count rolls back to the agreeing prefix; the rest is overwritten).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from localchat.engine.batch import build_batch
from localchat.engine.block_manager import BlockManager
from localchat.engine.interface import (
    CachedRequestData,
    ModelRunner,
    NewRequestData,
    SchedulerOutput,
)
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0, max_tokens=1, logprobs=0)  # logprobs: the draft's confidence
# A shadow this few tokens behind catches up one token per pass rather than in one multi-row pass: on
# CPU a pass of 3+ rows takes another kernel path that costs several one-row passes (Qwen2.5-0.5B Q4_K_M,
# 2 cores: 1 row 10 ms, 2 rows 14-25 ms, 3 rows 68 ms). Usually the gap is 1 or 2 (the target's own
# token, plus the bonus token when every draft was kept).
SINGLE_ROW_GAP = 4


@dataclass(slots=True, eq=False)
class _Shadow:
    request: Request  # the draft's view: committed tokens (all_token_ids), computed count, blocks
    fed: list[int] = field(default_factory=list)  # drafts whose K/V follow its computed tokens
    known: bool = False  # the draft runner has seen it (NewRequestData sent)


class DraftModelProposer:
    """Proposes with a draft model. `token_limit`: the target's embedding rows; a draft id at or past it
    ends the proposal (the target could not even embed it)."""

    def __init__(
        self,
        runner: ModelRunner,
        *,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        max_batch: int,
        token_limit: int,
        prefill_chunk_size: int = 512,
        p_min: float = 0.0,
    ) -> None:
        self.runner = runner
        runner.initialize_kv_cache(num_blocks, block_size)
        if (prepare := getattr(runner, "prepare_decode_graphs", None)) is not None:
            prepare(max_batch, max_model_len)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
        self.block_size = block_size
        self.token_limit = token_limit
        self.log_p_min = math.log(p_min) if p_min > 0 else -math.inf
        self.chunk = prefill_chunk_size or max_model_len
        self.shadows: dict[str, _Shadow] = {}
        self._forgotten: set[str] = set()  # shadows freed since the runner's last call
        self.passes = 0  # draft model forward passes, for the engine's stats

    def propose(self, wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        """Up to k greedy draft tokens for each (request, k). `live`: every request the engine still
        holds; shadows of the others are freed first."""
        for req_id in [r for r in self.shadows if r not in live]:
            self._free(req_id)
        ready: list[tuple[_Shadow, int]] = []  # shadows that get drafts this step, and their k
        scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        wanted_ids = {request.req_id for request, _ in wanted}
        for request, k in wanted:
            if k <= 0 or request.images:
                continue  # pictures: the draft has no vision tower to place them
            shadow = self._sync(request)
            hits = self._prefix_hits(shadow)
            mirror = shadow.request
            gap = mirror.num_tokens - mirror.num_computed_tokens
            # A short gap goes one token per pass, like the drafts after it; a prompt in chunks.
            num_new = 1 if gap <= SINGLE_ROW_GAP and not hits else min(gap, self.chunk)
            catching_up = mirror.num_computed_tokens + num_new < mirror.num_tokens
            lookahead = gap - num_new + k - 1 if gap <= SINGLE_ROW_GAP else 0 if catching_up else k - 1
            blocks = self._allocate(shadow, num_new, hits, lookahead, wanted_ids)
            if blocks is None:
                continue
            scheduled[request.req_id] = num_new
            if shadow.known:
                cached_reqs.append(CachedRequestData(request.req_id, blocks, mirror.num_computed_tokens))
            else:
                shadow.known = True
                new_reqs.append(
                    NewRequestData(
                        request.req_id,
                        mirror.prompt_token_ids,
                        [],
                        GREEDY,
                        list(mirror.block_ids),
                        mirror.num_computed_tokens,
                    )
                )
            if gap <= SINGLE_ROW_GAP or not catching_up:
                ready.append((shadow, k))
        if not scheduled:
            return {}
        first = self._run(scheduled, new_reqs, cached_reqs)
        for req_id, count in scheduled.items():
            self.shadows[req_id].request.num_computed_tokens += count
        drafts: dict[str, list[int]] = {s.request.req_id: [] for s, _ in ready}
        done: set[str] = set()
        self._take(first, drafts, done)
        self._decode(ready, drafts, done)
        for shadow, _ in ready:
            shadow.fed = drafts[shadow.request.req_id][:-1]
        return {req_id: self._usable(tokens) for req_id, tokens in drafts.items()}

    def _take(
        self, sampled: dict[str, tuple[int, float]], drafts: dict[str, list[int]], done: set[str]
    ) -> None:
        """Add each row's new draft, unless the draft model gives it less than `p_min`: then the row
        stops drafting (llama.cpp's --draft-p-min). A doubtful guess costs a draft pass and a target
        row, and is likely rejected."""
        for req_id, (token, logprob) in sampled.items():
            if req_id not in drafts:
                continue
            if logprob < self.log_p_min:
                done.add(req_id)
            else:
                drafts[req_id].append(token)

    def _decode(self, ready: list[tuple[_Shadow, int]], drafts: dict[str, list[int]], done: set[str]) -> None:
        """One token per row per pass until each row has its k drafts (or stopped): the rest of its
        committed tokens first (no draft yet), then its latest draft, which gives the next one."""
        while active := [
            s for s, k in ready if len(drafts[s.request.req_id]) < k and s.request.req_id not in done
        ]:
            committed = {s.request.req_id: s.request.num_tokens for s in active}
            for shadow in active:
                mirror = shadow.request
                if mirror.num_computed_tokens == mirror.num_tokens:
                    # The drafts so far stand after the committed tokens (for build_batch); the latest
                    # is fed. Taken back right after the pass.
                    mirror.all_token_ids.extend(drafts[mirror.req_id])
                    mirror.num_computed_tokens = mirror.num_tokens - 1
            try:
                tokens = self._run(
                    {s.request.req_id: 1 for s in active},
                    [],
                    [CachedRequestData(s.request.req_id, [], s.request.num_computed_tokens) for s in active],
                )
            finally:
                for shadow in active:
                    mirror = shadow.request
                    if mirror.num_tokens > committed[mirror.req_id]:
                        del mirror.all_token_ids[committed[mirror.req_id] :]
                        mirror.num_computed_tokens = mirror.num_tokens
                    else:
                        mirror.num_computed_tokens += 1  # a committed token caught up
            self._take(tokens, drafts, done)

    def _run(
        self, scheduled: dict[str, int], new_reqs: list[NewRequestData], cached: list[CachedRequestData]
    ) -> dict[str, tuple[int, float]]:
        """One draft forward pass; the greedy token of each row that reached its last token, with its
        logprob."""
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()),
            finished_req_ids=self._forgotten,
        )
        self._forgotten = set()
        requests = {req_id: self.shadows[req_id].request for req_id in scheduled}
        batch = build_batch(out, requests, self.block_size)
        result = self.runner.execute_model(out, batch)
        self.passes += 1
        logprobs = result.logprobs or [[] for _ in result.req_ids]
        return {
            r: (t[0], lp[0].logprob if lp else 0.0)
            for r, t, lp in zip(result.req_ids, result.sampled_token_ids, logprobs, strict=True)
            if t
        }

    def _sync(self, request: Request) -> _Shadow:
        """The request's shadow with its committed tokens caught up, and its computed count rolled back
        to what is still right: committed tokens plus the fed drafts the target accepted."""
        shadow = self.shadows.get(request.req_id)
        if shadow is None:
            mirror = Request(request.req_id, list(request.prompt_token_ids), GREEDY)
            mirror.all_token_ids = list(request.all_token_ids)
            shadow = self.shadows[request.req_id] = _Shadow(mirror)
            return shadow
        mirror = shadow.request
        computed = mirror.num_computed_tokens
        committed = request.all_token_ids
        mirror.all_token_ids.extend(committed[mirror.num_tokens :])
        agreeing = 0
        for draft, token in zip(shadow.fed, committed[computed:], strict=False):
            if draft != token:
                break
            agreeing += 1
        # The last committed token is always fed again: its logits give draft 1.
        mirror.num_computed_tokens = min(computed + agreeing, mirror.num_tokens - 1)
        shadow.fed = []
        return shadow

    def _prefix_hits(self, shadow: _Shadow) -> list[int]:
        """A shadow without blocks (new, or evicted) starts from the draft's prefix cache."""
        mirror = shadow.request
        if mirror.block_ids:
            return []
        hits = self.block_manager.get_computed_blocks(mirror)
        mirror.num_computed_tokens = len(hits) * self.block_size
        return hits

    def _allocate(
        self, shadow: _Shadow, num_new: int, hits: list[int], lookahead: int, keep: set[str]
    ) -> list[int] | None:
        """Blocks for the pass, evicting shadows of requests that do not speculate now if needed."""
        mirror = shadow.request
        while (
            blocks := self.block_manager.allocate_slots(mirror, num_new, hits, num_lookahead=lookahead)
        ) is None:
            idle = next((r for r in self.shadows if r not in keep), None)
            if idle is None:
                if hits:
                    mirror.num_computed_tokens = 0  # not admitted: look the prefix up again next time
                return None  # no room: this sequence decodes without drafts this step
            self._free(idle)
        return blocks

    def release(self, req_id: str) -> None:
        """The request ended: free its shadow's blocks now (they stay in the draft's prefix cache)."""
        if req_id in self.shadows:
            self._free(req_id)

    def _free(self, req_id: str) -> None:
        shadow = self.shadows.pop(req_id)
        self.block_manager.free(shadow.request)
        if shadow.known:
            self._forgotten.add(req_id)

    def _usable(self, tokens: list[int]) -> list[int]:
        for i, token in enumerate(tokens):
            if token >= self.token_limit:
                return tokens[:i]
        return tokens
