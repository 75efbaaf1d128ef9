"""The draft-model proposer (`--speculative draft`): a small model with the target's vocabulary guesses
k tokens per speculating sequence, batched across sequences, before the target's step scores them.
Greedy and seeded requests get greedy drafts (a one-hot q: engine/speculative.py's "kept while equal" is
then the exact rule, and a seeded request stays token-identical to plain decoding). An unseeded sampled
request gets drafts drawn from the draft's own distribution q (its logits under the request's sampling
settings, engine/spec_sampling.py), and each q rides with its draft to the target's sampler, which keeps
it with probability min(1, p/q) or draws from norm(max(0, p - q)).

The draft has its own runner (same backend, its own weights) and its own small paged KV cache, with its
own BlockManager. Each target sequence has a shadow request here holding the same committed tokens.
Per step, for every sequence that speculates:
  pass 1: the shadow's missing tokens (a prompt, or the one to three tokens the target committed last
          step), ending with the last committed token: the draft's token after it is draft 1;
  pass j: draft j-1 alone at the next position: draft j.
Draft tokens fed in passes 2..k sit in the shadow's KV after its committed tokens, like the target's
drafts: never prefix-cached, and kept next step only as far as the target accepted them (the shadow's
computed count rolls back to the agreeing prefix; the rest is overwritten).

A draft pass that raises costs that step its drafts, never the engine: the blocks the step's first pass
named (their K/V perhaps never written) are unnamed, the shadows that took part are freed (rebuilt from
the trusted part of the draft's prefix cache when next asked), and the target decodes without drafts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from localchat.engine.batch import build_batch
from localchat.engine.block_manager import BlockManager
from localchat.engine.draft_states import DraftStates
from localchat.engine.interface import (
    CachedRequestData,
    ModelRunner,
    NewRequestData,
    SchedulerOutput,
)
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.spec_sampling import draw, processed_probs

log = logging.getLogger(__name__)

GREEDY = SamplingParams(temperature=0.0, max_tokens=1, logprobs=0)  # logprobs: the draft's confidence
# A shadow this few tokens behind catches up one token per pass rather than in one multi-row pass: on
# CPU a pass of 3+ rows takes another kernel path that costs several one-row passes (Qwen2.5-0.5B Q4_K_M,
# 2 cores: 1 row 10 ms, 2 rows 14-25 ms, 3 rows 68 ms). Usually the gap is 1 or 2 (the target's own
# token, plus the bonus token when every draft was kept).
SINGLE_ROW_GAP = 4

# One draft: (token, the draft's confidence as a log-probability, the q it was drawn from or None).
Guess = tuple[int, float, np.ndarray | None]


def draft_params(params: SamplingParams) -> SamplingParams:
    """The shadow's sampling settings: the request's own for an unseeded sampled request (its drafts are
    drawn from q), else greedy (a seeded request keeps its tokens identical to plain decoding's)."""
    if params.temperature == 0 or params.seed is not None:
        return GREEDY
    return replace(params, logprobs=None, constraint=None, stop=[], stop_token_ids=[])


@dataclass(slots=True, eq=False)
class _Shadow:
    request: Request  # the draft's view: committed tokens (all_token_ids), computed count, blocks
    fed: list[int] = field(default_factory=list)  # drafts whose K/V follow its computed tokens
    known: bool = False  # the draft runner has seen it (NewRequestData sent)

    @property
    def sampled(self) -> bool:
        return self.request.sampling_params is not GREEDY


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
        seed: int | None = 0,
        num_tokens: int = 1,
    ) -> None:
        """`num_tokens`: the most drafts a sequence asks for (k), for a hybrid draft's snapshot rows."""
        self.runner = runner
        runner.initialize_kv_cache(num_blocks, block_size)
        # A hybrid draft (Qwen3.5-0.8B for a larger Qwen3.5): its recurrent states (draft_states.py).
        self.states: DraftStates | None = None
        state_spec = getattr(runner, "state_cache_spec", None)
        if state_spec is not None and state_spec.bytes_per_slot > 0:
            self.states = DraftStates(runner, state_spec, max_batch, num_tokens - 1)
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
        self.rng = np.random.default_rng(seed)  # draws the sampled drafts from q
        self._has_logits = hasattr(runner, "compute_logits")

    def propose(self, wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        """Up to k draft tokens for each (request, k); a sampled request's q per draft goes to its
        `spec_draft_probs`. `live`: every request the engine still holds; shadows of the others are
        freed first."""
        for req_id in [r for r in self.shadows if r not in live]:
            self._free(req_id)
        for request, _ in wanted:
            request.spec_draft_probs = None
        step = self.block_manager.step  # what this call's first pass names, it names under this step
        try:
            return self._propose(wanted)
        except Exception:  # a draft that fails must not take the engine down: no drafts this step
            log.exception("draft model pass failed; this step decodes without drafts")
            self._abandon(wanted, step)
            return {}
        finally:
            self.block_manager.end_step()

    def _abandon(self, wanted: list[tuple[Request, int]], step: int) -> None:
        """After a failed pass: unname what `step` named and free the shadows that took part."""
        shadows = [self.shadows[r.req_id] for r, _ in wanted if r.req_id in self.shadows]
        self.block_manager.forget_unwritten([s.request for s in shadows], step)
        for request, _ in wanted:
            request.spec_draft_probs = None
            if request.req_id in self.shadows:
                self._free(request.req_id)
        if self.states is not None:  # the failed pass took every shadow's queued state copies along
            for req_id in list(self.shadows):
                self._free(req_id)

    def _propose(self, wanted: list[tuple[Request, int]]) -> dict[str, list[int]]:
        ready: list[tuple[_Shadow, int]] = []  # shadows that get drafts this step, and their k
        scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        wanted_ids = {request.req_id for request, _ in wanted}
        for request, k in wanted:
            if k <= 0 or request.images:
                continue  # pictures: the draft has no vision tower to place them
            shadow = self._sync(request)
            if not self._state_row(request.req_id, wanted_ids):
                continue
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
                        mirror.sampling_params,
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
        probs: dict[str, list[np.ndarray]] = {s.request.req_id: [] for s, _ in ready if s.sampled}
        done: set[str] = set()
        self._take(first, drafts, probs, done)
        self._decode(ready, drafts, probs, done)
        for shadow, _ in ready:
            shadow.fed = drafts[shadow.request.req_id][:-1]
        out = {req_id: self._usable(tokens) for req_id, tokens in drafts.items()}
        for request, _ in wanted:
            if request.req_id in probs and out.get(request.req_id):
                request.spec_draft_probs = probs[request.req_id][: len(out[request.req_id])]
        return out

    def _take(
        self,
        guesses: dict[str, Guess],
        drafts: dict[str, list[int]],
        probs: dict[str, list[np.ndarray]],
        done: set[str],
    ) -> None:
        """Add each row's new draft, unless the draft model's confidence is under `p_min`: then the row
        stops drafting (llama.cpp's --draft-p-min). A doubtful guess costs a draft pass and a target
        row, and is likely rejected. For a sampled draft the confidence is q's largest probability,
        known before the draw, so which drafts are kept never depends on the drawn token (the kept
        drafts stay distributed as q)."""
        for req_id, (token, logprob, q) in guesses.items():
            if req_id not in drafts:
                continue
            if logprob < self.log_p_min or logprob == -math.inf:
                done.add(req_id)
            else:
                drafts[req_id].append(token)
                if q is not None:
                    probs[req_id].append(q)

    def _decode(
        self,
        ready: list[tuple[_Shadow, int]],
        drafts: dict[str, list[int]],
        probs: dict[str, list[np.ndarray]],
        done: set[str],
    ) -> None:
        """One token per row per pass until each row has its k drafts (or stopped): the rest of its
        committed tokens first (no draft yet), then its latest draft, which gives the next one."""
        while active := [
            s for s, k in ready if len(drafts[s.request.req_id]) < k and s.request.req_id not in done
        ]:
            committed = {s.request.req_id: s.request.num_tokens for s in active}
            for shadow in active:
                mirror = shadow.request
                if mirror.num_computed_tokens == mirror.num_tokens:
                    if self.states is not None:  # the state before this draft, in case it is rejected
                        self.states.snapshot(mirror.req_id)
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
            self._take(tokens, drafts, probs, done)

    def _run(
        self, scheduled: dict[str, int], new_reqs: list[NewRequestData], cached: list[CachedRequestData]
    ) -> dict[str, Guess]:
        """One draft forward pass; the draft of each row that reached its last token: greedy with its
        logprob, or drawn from q (`_guesses`) when a sampled shadow is in the pass."""
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()),
            finished_req_ids=set(self._forgotten),
        )
        requests = {req_id: self.shadows[req_id].request for req_id in scheduled}
        states = self.states
        if states is not None:
            out.state_copies = states.take_copies()  # restores first, then this pass's snapshots
        batch = build_batch(out, requests, self.block_size, states.slots if states is not None else None)
        if any(self.shadows[r].sampled for r in scheduled):
            logits = self.runner.compute_logits(out, batch)  # type: ignore[attr-defined]
            self._ran(out)
            return self._guesses(_numpy(logits), batch.sample_req_ids, batch.sampling)
        result = self.runner.execute_model(out, batch)
        self._ran(out)
        logprobs = result.logprobs or [[] for _ in result.req_ids]
        return {
            r: (t[0], lp[0].logprob if lp else 0.0, None)
            for r, t, lp in zip(result.req_ids, result.sampled_token_ids, logprobs, strict=True)
            if t
        }

    def _ran(self, out: SchedulerOutput) -> None:
        self._forgotten -= out.finished_req_ids  # told (kept to tell again if the pass raised)
        self.passes += 1
        if self.states is not None:
            for req_id, count in out.num_scheduled_tokens.items():
                self.states.advance(req_id, count)

    def _guesses(self, logits: np.ndarray, req_ids: list[str], sampling: Any) -> dict[str, Guess]:
        """Drafts from the pass's logits [rows, vocab]: a greedy row's argmax with its raw logprob (what
        the runner reports), a sampled row's draw from q, the request's processed distribution with
        ids the target cannot embed removed (so the draw never needs cutting, which would change q)."""
        out: dict[str, Guess] = {}
        sampled = [i for i, r in enumerate(req_ids) if self.shadows[r].sampled]
        qs = processed_probs(logits[sampled], sampling.take(sampled)) if sampled else None
        for i, req_id in enumerate(req_ids):
            if i not in sampled:
                row = logits[i].astype(np.float64)
                token = int(np.argmax(row))
                out[req_id] = (token, -float(np.log(np.exp(row - row.max()).sum())), None)
                continue
            assert qs is not None
            q = qs[sampled.index(i)]
            q[self.token_limit :] = 0.0
            total = q.sum()
            if not total > 0:  # all its mass on ids the target lacks: no draft from this row
                out[req_id] = (0, -math.inf, None)
                continue
            q = (q / total).astype(np.float32)
            out[req_id] = (draw(q, self.rng), math.log(float(q.max())), q)
        return out

    def _sync(self, request: Request) -> _Shadow:
        """The request's shadow with its committed tokens caught up, and its computed count rolled back
        to what is still right: committed tokens plus the fed drafts the target accepted."""
        shadow = self.shadows.get(request.req_id)
        if shadow is None:
            # A runner that cannot hand out logits drafts greedily for everyone (still exact, lower yield).
            params = draft_params(request.sampling_params) if self._has_logits else GREEDY
            mirror = Request(request.req_id, list(request.prompt_token_ids), params)
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
        if self.states is not None:  # a hybrid draft: its state back to those tokens too (or to 0)
            tokens = mirror.num_computed_tokens
            in_row = request.req_id in self.states.slots
            mirror.num_computed_tokens = self.states.rewind(request.req_id, tokens) if in_row else 0
        return shadow

    def _state_row(self, req_id: str, keep: set[str]) -> bool:
        """A hybrid draft's shadow needs a live state row: one is freed from a shadow of a request that
        does not speculate now if needed; False when none can be."""
        states = self.states
        while states is not None and not states.allocate(req_id):
            idle = next((r for r in self.shadows if r not in keep and r in states.slots), None)
            if idle is None:
                return False
            self._free(idle)
        return True

    def _prefix_hits(self, shadow: _Shadow) -> list[int]:
        """A shadow without blocks (new, or evicted) starts from the draft's prefix cache."""
        mirror = shadow.request
        if mirror.block_ids or self.states is not None:  # a hybrid draft keeps no state checkpoints
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
        if self.states is not None:
            self.states.free(req_id)
        if shadow.known:
            self._forgotten.add(req_id)

    def _usable(self, tokens: list[int]) -> list[int]:
        for i, token in enumerate(tokens):
            if token >= self.token_limit:
                return tokens[:i]
        return tokens


def _numpy(logits: Any) -> np.ndarray:
    """A runner's logits (a torch tensor, maybe on a GPU, or an MLX array) as a float32 numpy array."""
    if hasattr(logits, "cpu"):
        logits = logits.cpu()
    return np.asarray(logits, dtype=np.float32)
