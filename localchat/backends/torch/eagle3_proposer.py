"""`--speculative eagle`: an EAGLE-3 head (eagle3_head.py) proposes k draft tokens per speculating
sequence from the target's own hidden states.

The target runner, while this proposer is attached, keeps the inputs of the head's three layers for
every row of the step (`HiddenTaps`): a decode-only CPU step stays the one fused C call, which copies
them out (decode_step.py); other steps run the layers one by one. No CUDA graph then; the plain path is
untouched when EAGLE is off. A row at position p the target kept (p below the
request's computed count after acceptance) becomes a head row: the target's token p + 1 embedded, and
the fused hidden states. Rows of rejected drafts are dropped.

The head's K/V live here, per request, in position order (a short growable buffer; prefix-cache hits
the target did not compute are simply absent). Per step, in one batched pass, every speculating request
feeds its new target rows; the last gives draft 1. Then k - 1 one-row passes feed the head's own output
and the previous draft; those rows are taken back at the next step, when the target's rows for the same
positions replace them. Drafts are greedy (a one-hot q keeps engine/speculative.py's rule exact).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from localchat.backends.torch.attention import AttentionMetadata
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.qwen_vl import VisionLanguage
from localchat.engine.interface import BatchInputs
from localchat.engine.request import Request

# Decoder classes whose text steps are the plain embed -> layers loop that HiddenTaps repeats.
PLAIN_LOOPS = (DecoderLM.hidden_states, VisionLanguage.hidden_states)
# Target rows kept per request while it does not speculate (a large batch, a pause after misses).
MAX_PENDING_ROWS = 4096


class DraftHead(Protocol):
    """What the proposer drives: an EAGLE-3 head, or a checkpoint's MTP head (mtp_head.py)."""

    draft_to_target: torch.Tensor

    @property
    def device(self) -> torch.device: ...

    def embed(self, tokens: torch.Tensor, model: DecoderLM) -> torch.Tensor: ...
    def fuse(self, aux: torch.Tensor) -> torch.Tensor: ...
    def qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]: ...
    def attend(
        self,
        q: torch.Tensor,
        q_positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> torch.Tensor: ...
    def finish(self, attn: torch.Tensor, residual: Any) -> torch.Tensor: ...
    def logits(self, out: torch.Tensor) -> torch.Tensor: ...
    def feedback(self, out: torch.Tensor) -> torch.Tensor: ...


class HiddenTaps:
    """The inputs of `layers` (index L: the last layer's output) for every row of the step go to `sink`
    with the step's batch. A decode-only step the fused C call takes (decode_step.py) stays one call that
    copies them out; any other step runs the layers one at a time."""

    def __init__(self, layers: list[int], sink: Callable[[BatchInputs, torch.Tensor], None]) -> None:
        self.layers = layers
        self.sink = sink
        self.fused = True  # False: every step layer by layer, as before the fused copies (spec_bench)
        self.fused_steps = 0  # steps that kept the fused decode call (tests assert on it)
        self.layer_steps = 0

    def hidden_states(
        self,
        model: DecoderLM,
        batch: BatchInputs,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        kept: dict[int, torch.Tensor] = {}
        x = model.embed_tokens(input_ids)
        cos, sin = model.rotary(positions, x.dtype)
        fused = model.decode_plan() if self.fused else None
        if fused is not None and fused.takes(x, cos, meta, kv_caches):
            assert isinstance(meta, AttentionMetadata)
            x, aux = fused.run_keeping(x, cos, sin, meta, kv_caches, self.layers)
            self.fused_steps += 1
            self.sink(batch, aux)
            return x
        self.layer_steps += 1
        for index, (layer, kv_cache) in enumerate(zip(model.layers, kv_caches, strict=True)):
            if index in self.layers:
                kept[index] = x
            x = layer.forward(x, cos, sin, meta, kv_cache)  # .forward: skip hook dispatch
        kept[len(model.layers)] = x
        self.sink(batch, torch.cat([kept[i] for i in self.layers], dim=-1))
        return x


class _Rows:
    """A growable [n, ...] buffer with the positions of its rows."""

    def __init__(self) -> None:
        self.positions = torch.empty(0, dtype=torch.long)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.size = 0

    def keep_below(self, position: int) -> None:
        """Drop every row at `position` or later (recomputed or speculative rows)."""
        if self.size:
            self.size = int((self.positions[: self.size] < position).sum())

    def append(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        need = self.size + positions.shape[0]
        if self.k is None or self.v is None or need > self.k.shape[0]:
            capacity = max(64, need * 2)
            grown_k = k.new_empty((capacity, *k.shape[1:]))
            grown_v = v.new_empty((capacity, *v.shape[1:]))
            grown_p = torch.empty(capacity, dtype=torch.long, device=positions.device)
            if self.k is not None and self.v is not None and self.size:
                grown_k[: self.size] = self.k[: self.size]
                grown_v[: self.size] = self.v[: self.size]
                grown_p[: self.size] = self.positions[: self.size]
            self.k, self.v, self.positions = grown_k, grown_v, grown_p
        self.k[self.size : need] = k
        self.v[self.size : need] = v
        self.positions[self.size : need] = positions
        self.size = need

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.k is not None and self.v is not None
        return self.k[: self.size], self.v[: self.size], self.positions[: self.size]


@dataclass(slots=True, eq=False)
class _State:
    cache: _Rows = field(default_factory=_Rows)
    committed: int = 0  # cache rows from target hidden states; rows past it are the last drafts'
    # Target rows not yet fed to the head: (positions, hidden states), in step order.
    pending: list[tuple[np.ndarray, torch.Tensor]] = field(default_factory=list)
    last: tuple[int, torch.Tensor] | None = None  # (position, head output) of the latest target row


@dataclass(slots=True)
class _Feed:
    """One pass's rows: per request, how many rows, in order."""

    req_ids: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)
    tokens: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)


class Eagle3Proposer:
    def __init__(self, head: DraftHead, model: DecoderLM, token_limit: int) -> None:
        self.head = head
        self.model = model
        self.token_limit = token_limit
        self.states: dict[str, _State] = {}
        self.passes = 0  # head forward passes, for the engine's stats

    def propose(self, wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        for req_id in [r for r in self.states if r not in live]:
            del self.states[req_id]
        with torch.inference_mode():
            return self._propose(wanted)

    def release(self, req_id: str) -> None:
        self.states.pop(req_id, None)

    def file_step(self, batch: BatchInputs, aux: torch.Tensor) -> None:
        """The target's step ran: keep its rows' hidden states under their requests until the head
        reads them (a copy: the step's tensor is freed)."""
        starts = batch.query_start_loc
        for i, req_id in enumerate(batch.req_ids):
            rows = slice(int(starts[i]), int(starts[i + 1]))
            positions = np.asarray(batch.positions[rows], dtype=np.int64)
            if not len(positions):
                continue
            state = self.states.setdefault(req_id, _State())
            first = int(positions[0])
            # Rows from an earlier step at these positions were rejected drafts or are recomputed now.
            # The chunks stay in position order, so only the last ones can reach `first`: a step does
            # not walk every row a long non-speculating sequence has kept.
            pending = state.pending
            while pending and (not len(pending[-1][0]) or pending[-1][0][-1] >= first):
                p, h = pending.pop()
                keep = p < first
                if keep.any():
                    pending.append((p[keep], h[torch.from_numpy(keep)]))
                    break
            pending.append((positions, aux[rows].clone()))
            while sum(len(p) for p, _ in state.pending) > MAX_PENDING_ROWS and len(state.pending) > 1:
                state.pending.pop(0)  # a long wait without drafting: the head loses the oldest context

    def _propose(self, wanted: list[tuple[Request, int]]) -> dict[str, list[int]]:
        feed = _Feed()
        ready: dict[str, tuple[_State, int, int]] = {}  # req_id -> (state, k, position of draft 1's row)
        taken: dict[str, tuple[_State, list[tuple[np.ndarray, torch.Tensor]]]] = {}
        try:
            for request, k in wanted:
                state = self.states.get(request.req_id)
                if k <= 0 or state is None or request.images:
                    continue
                computed = request.num_computed_tokens
                taken[request.req_id] = (state, state.pending)
                positions, hidden = self._valid_rows(state, computed)
                state.cache.size = min(state.cache.size, state.committed)  # the last drafts' rows go
                state.cache.keep_below(int(positions[0]) if len(positions) else computed)
                state.committed = state.cache.size
                if len(positions):
                    tokens = [request.all_token_ids[p + 1] for p in positions.tolist()]
                    feed.req_ids.append(request.req_id)
                    feed.counts.append(len(tokens))
                    feed.positions.append(torch.from_numpy(positions))
                    feed.tokens.append(torch.tensor(tokens, dtype=torch.long))
                    feed.hidden.append(self.head.fuse(hidden))
                    state.last = None
                elif state.last is None or state.last[0] != computed - 1:
                    continue  # the head has not seen the row before the next token: no drafts
                ready[request.req_id] = (state, k, computed - 1)
            outputs = self._pass(feed) if feed.req_ids else {}
        except BaseException:
            _give_back(taken)
            raise
        for req_id, out in outputs.items():
            state = self.states[req_id]
            state.committed = state.cache.size
            last_position = int(feed.positions[feed.req_ids.index(req_id)][-1])
            state.last = (last_position, out[-1])
        drafts: dict[str, list[int]] = {}
        last: dict[str, torch.Tensor] = {}
        for req_id, (state, _, position) in list(ready.items()):
            if state.last is None or state.last[0] != position:
                del ready[req_id]  # a hole before the next token (rows dropped): no drafts this time
                continue
            last[req_id] = state.last[1]
            drafts[req_id] = []
        self._draft(ready, last, drafts)
        return drafts

    def _valid_rows(self, state: _State, computed: int) -> tuple[np.ndarray, torch.Tensor]:
        """The pending target rows the target kept (below its computed count); all pending ones go."""
        positions = [p[p < computed] for p, _ in state.pending]
        hidden = [h[torch.from_numpy(p < computed)] for p, h in state.pending]
        state.pending = []
        if not positions:
            return np.zeros(0, dtype=np.int64), torch.empty(0)
        return np.concatenate(positions), torch.cat(hidden)

    def _draft(
        self,
        ready: dict[str, tuple[_State, int, int]],
        last: dict[str, torch.Tensor],
        drafts: dict[str, list[int]],
    ) -> None:
        """Greedy drafts: one from each request's latest output, then one head pass per further draft."""
        active = list(ready)
        step = 0
        while active:
            logits = self.head.logits(torch.stack([last[r] for r in active]))
            tokens = self.head.draft_to_target[logits.argmax(dim=-1)].tolist()
            feed = _Feed()
            for req_id, token in zip(active, tokens, strict=True):
                _, k, position = ready[req_id]
                if token >= self.token_limit:
                    continue
                drafts[req_id].append(token)
                if len(drafts[req_id]) < k:
                    feed.req_ids.append(req_id)
                    feed.counts.append(1)
                    feed.positions.append(torch.tensor([position + 1 + step]))
                    feed.tokens.append(torch.tensor([token]))
                    feed.hidden.append(self.head.feedback(last[req_id])[None])
            if not feed.req_ids:
                return
            outputs = self._pass(feed)
            last = {r: out[-1] for r, out in outputs.items()}
            active = feed.req_ids
            step += 1

    def _pass(self, feed: _Feed) -> dict[str, torch.Tensor]:
        """One head pass over every request's rows; their K/V join the request's cache. Returns each
        request's outputs [rows, hidden]."""
        head = self.head
        positions = torch.cat(feed.positions).to(head.device)
        tokens = torch.cat(feed.tokens).to(head.device)
        hidden = torch.cat(feed.hidden)
        embeds = head.embed(tokens, self.model).to(hidden.dtype)
        q, k, v, residual = head.qkv(embeds, hidden, positions)
        attended = []
        start = 0
        for req_id, count in zip(feed.req_ids, feed.counts, strict=True):
            rows = slice(start, start + count)
            cache = self.states[req_id].cache
            cache.append(positions[rows], k[rows], v[rows])
            cached_k, cached_v, cached_positions = cache.view()
            attended.append(head.attend(q[rows], positions[rows], cached_k, cached_v, cached_positions))
            start += count
        out = head.finish(torch.cat(attended), residual)
        self.passes += 1
        result: dict[str, torch.Tensor] = {}
        start = 0
        for req_id, count in zip(feed.req_ids, feed.counts, strict=True):
            result[req_id] = out[start : start + count]
            start += count
        return result


def _give_back(taken: dict[str, tuple[_State, list[tuple[np.ndarray, torch.Tensor]]]]) -> None:
    """The pass that was to feed these requests' target rows to the head failed (engine/speculative.py
    `propose_safely` drops the step's drafts): put the rows back as pending and drop whatever the pass
    appended, so the next step feeds them again and the head's cache holds every position, as if this
    pass had never run. (Without this the head went on drafting from a cache with those positions
    missing: outputs stayed exact, drafts got worse.) A failure in a later draft pass needs nothing:
    its rows sit past `committed` and go at the next step anyway."""
    for state, pending in taken.values():
        state.pending = pending
        state.cache.size = min(state.cache.size, state.committed)
        state.committed = state.cache.size
