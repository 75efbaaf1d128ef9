"""`--speculative mtp` on MLX: the checkpoint's own multi-token-prediction head (mtp_head.py) proposes k
greedy draft tokens per speculating sequence. The same bookkeeping as the torch proposer
(localchat/backends/torch/eagle3_proposer.py, read its docstring), with MLX arrays: the runner hands
every step's last hidden states to `file_step` (only while a head is attached); a row at position p the
target kept (below the request's computed count after acceptance) becomes a head row with the target's
token p + 1; rows of rejected drafts are dropped. The head's K/V live here per request, in position
order. Per step one batched pass feeds each speculating request's new target rows (the last gives
draft 1), then k - 1 one-row passes feed the head's own output and the previous draft; those rows go at
the next step, when the target's rows for the same positions replace them. Greedy drafts keep
engine/speculative.py's rule exact (a one-hot q).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from localchat.backends.mlx.mtp_head import MTP_MODEL_TYPES, MtpHead, MtpLoadError
from localchat.engine.interface import BatchInputs
from localchat.engine.request import Request
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.backends.mlx.runner import MLXRunner

MAX_PENDING_ROWS = 4096  # target rows kept per request while it does not speculate


@dataclass(slots=True, eq=False)
class _State:
    # The head's cache rows [capacity, kvh, d] in position order, the first `len(positions)` valid: a
    # growable buffer written in place (a slice write into a buffer nothing else holds is a scatter in
    # place, attention.py), so a step costs its new rows, not a copy of the request's whole cache.
    k_buf: mx.array | None = None
    v_buf: mx.array | None = None
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    committed: int = 0  # cache rows from target hidden states; rows past it are the last drafts'
    pending: list[tuple[np.ndarray, mx.array]] = field(default_factory=list)  # target rows not yet fed
    last: tuple[int, mx.array] | None = None  # (position, head output) of the latest target row

    @property
    def k(self) -> mx.array | None:
        return None if self.k_buf is None else self.k_buf[: len(self.positions)]

    @property
    def v(self) -> mx.array | None:
        return None if self.v_buf is None else self.v_buf[: len(self.positions)]

    def keep(self, size: int) -> None:
        self.positions = self.positions[: min(size, len(self.positions))]

    def keep_below(self, position: int) -> None:
        self.keep(int((self.positions < position).sum()))

    def append(self, positions: np.ndarray, k: mx.array, v: mx.array) -> None:
        size = len(self.positions)
        need = size + len(positions)
        if self.k_buf is None or self.v_buf is None or need > self.k_buf.shape[0]:
            capacity = max(64, 2 * need)
            grown_k = mx.zeros((capacity, *k.shape[1:]), dtype=k.dtype)
            grown_v = mx.zeros((capacity, *v.shape[1:]), dtype=v.dtype)
            if self.k_buf is not None and self.v_buf is not None and size:
                grown_k[:size] = self.k_buf[:size]
                grown_v[:size] = self.v_buf[:size]
            self.k_buf, self.v_buf = grown_k, grown_v
        self.k_buf[size:need] = k
        self.v_buf[size:need] = v
        self.positions = np.concatenate([self.positions, positions])


@dataclass(slots=True)
class _Feed:
    req_ids: list[str] = field(default_factory=list)
    positions: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    hidden: list[mx.array] = field(default_factory=list)


class MtpProposer:
    def __init__(
        self, head: MtpHead, token_limit: int, stream: Callable[[], AbstractContextManager[None]]
    ) -> None:
        self.head = head
        self.token_limit = token_limit
        self.stream = stream  # the runner's per-thread stream context (runner.py `_thread_stream`)
        self.states: dict[str, _State] = {}
        self.passes = 0  # head forward passes, for the engine's stats

    def release(self, req_id: str) -> None:
        self.states.pop(req_id, None)

    def file_step(self, batch: BatchInputs, hidden: mx.array) -> None:
        """The target's step ran: keep its rows' last hidden states under their requests."""
        starts = batch.query_start_loc
        for i, req_id in enumerate(batch.req_ids):
            a, b = int(starts[i]), int(starts[i + 1])
            positions = np.asarray(batch.positions[a:b], dtype=np.int64)
            if not len(positions):
                continue
            state = self.states.setdefault(req_id, _State())
            first = int(positions[0])
            pending = state.pending  # rows at these positions or later: rejected drafts or recomputed
            while pending and (not len(pending[-1][0]) or pending[-1][0][-1] >= first):
                p, h = pending.pop()
                keep = p < first
                if keep.any():
                    pending.append((p[keep], h[mx.array(np.flatnonzero(keep).astype(np.int32))]))
                    break
            pending.append((positions, hidden[a:b]))
            while sum(len(p) for p, _ in pending) > MAX_PENDING_ROWS and len(pending) > 1:
                pending.pop(0)  # a long wait without drafting: the head loses the oldest context

    def propose(self, wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        for req_id in [r for r in self.states if r not in live]:
            del self.states[req_id]
        with self.stream():
            return self._propose(wanted)

    def _propose(self, wanted: list[tuple[Request, int]]) -> dict[str, list[int]]:
        feed = _Feed()
        ready: dict[str, tuple[_State, int, int]] = {}  # req_id -> (state, k, position of draft 1's row)
        taken: list[tuple[_State, list[tuple[np.ndarray, mx.array]]]] = []
        try:
            for request, k in wanted:
                state = self.states.get(request.req_id)
                if k <= 0 or state is None or request.images:
                    continue
                computed = request.num_computed_tokens
                taken.append((state, state.pending))
                positions, hidden = _valid_rows(state, computed)
                state.keep(state.committed)  # the last drafts' rows go
                state.keep_below(int(positions[0]) if len(positions) else computed)
                state.committed = len(state.positions)
                if len(positions):
                    ids = request.all_token_ids
                    feed.req_ids.append(request.req_id)
                    feed.positions.append(positions)
                    feed.tokens.append(np.array([ids[p + 1] for p in positions.tolist()], dtype=np.int32))
                    feed.hidden.append(self.head.fuse(hidden))
                    state.last = None
                elif state.last is None or state.last[0] != computed - 1:
                    continue  # the head has not seen the row before the next token: no drafts
                ready[request.req_id] = (state, k, computed - 1)
            outputs = self._pass(feed) if feed.req_ids else {}
        except BaseException:
            for state, pending in taken:  # as the torch proposer's `_give_back`: as if never run
                state.pending = pending
                state.keep(state.committed)
            raise
        for req_id, out in outputs.items():
            state = self.states[req_id]
            state.committed = len(state.positions)
            state.last = (int(feed.positions[feed.req_ids.index(req_id)][-1]), out[-1])
        drafts: dict[str, list[int]] = {}
        last: dict[str, mx.array] = {}
        for req_id, (state, _, position) in list(ready.items()):
            if state.last is None or state.last[0] != position:
                del ready[req_id]  # a hole before the next token (rows dropped): no drafts this time
                continue
            last[req_id] = state.last[1]
            drafts[req_id] = []
        self._draft(ready, last, drafts)
        return drafts

    def _draft(
        self,
        ready: dict[str, tuple[_State, int, int]],
        last: dict[str, mx.array],
        drafts: dict[str, list[int]],
    ) -> None:
        active = list(ready)
        step = 0
        while active:
            logits = self.head.logits(mx.stack([last[r] for r in active]))
            tokens = np.array(mx.argmax(logits, axis=-1)).tolist()
            feed = _Feed()
            for req_id, token in zip(active, tokens, strict=True):
                _, k, position = ready[req_id]
                if token >= self.token_limit:
                    continue
                drafts[req_id].append(int(token))
                if len(drafts[req_id]) < k:
                    feed.req_ids.append(req_id)
                    feed.positions.append(np.array([position + 1 + step], dtype=np.int64))
                    feed.tokens.append(np.array([token], dtype=np.int32))
                    feed.hidden.append(self.head.feedback(last[req_id])[None])
            if not feed.req_ids:
                return
            outputs = self._pass(feed)
            last = {r: out[-1] for r, out in outputs.items()}
            active = feed.req_ids
            step += 1

    def _pass(self, feed: _Feed) -> dict[str, mx.array]:
        """One head pass over every request's rows; their K/V join the request's cache."""
        spans: list[tuple[int, int]] = []
        start = 0
        for p in feed.positions:
            spans.append((start, start + len(p)))
            start += len(p)

        def attend(i: int, q: mx.array, k: mx.array, v: mx.array, q_positions: mx.array) -> mx.array:
            state = self.states[feed.req_ids[i]]
            state.append(feed.positions[i], k, v)
            assert state.k is not None and state.v is not None
            k_positions = mx.array(state.positions.astype(np.int32))
            return self.head.attention(q, q_positions, state.k, state.v, k_positions)

        positions = mx.array(np.concatenate(feed.positions).astype(np.int32))
        tokens = mx.array(np.concatenate(feed.tokens))
        out = self.head.run(tokens, mx.concatenate(feed.hidden), positions, spans, attend)
        buffers = [
            a for r in feed.req_ids for a in (self.states[r].k_buf, self.states[r].v_buf) if a is not None
        ]
        mx.eval(out, buffers)
        self.passes += 1
        return {r: out[a:b] for r, (a, b) in zip(feed.req_ids, spans, strict=True)}


def _valid_rows(state: _State, computed: int) -> tuple[np.ndarray, mx.array]:
    """The pending target rows the target kept (below its computed count); all pending ones go."""
    positions: list[np.ndarray] = []
    hidden: list[mx.array] = []
    for p, h in state.pending:
        keep = p < computed
        if keep.all():
            positions.append(p)
            hidden.append(h)
        elif keep.any():
            positions.append(p[keep])
            hidden.append(h[mx.array(np.flatnonzero(keep).astype(np.int32))])
    state.pending = []
    if not positions:
        return np.zeros(0, dtype=np.int64), mx.zeros((0,))
    return np.concatenate(positions), mx.concatenate(hidden)


def attach_mtp(
    runner: MLXRunner, weights: Iterable[WeightTensor], target_name: str, token_limit: int
) -> MtpProposer:
    """Load the head from `weights` (only `mtp.*` are read) and have the runner hand each step's last
    hidden states to it from now on. MtpLoadError when the model has no such head."""
    config = runner.config
    if config.model_type not in MTP_MODEL_TYPES:
        raise MtpLoadError(
            f"--speculative mtp: {target_name} ({config.model_type}) has no multi-token-prediction head the "
            "MLX backend runs (Qwen3.5 and Qwen3-Next checkpoints carry one; GLM-4.5's runs on --backend "
            "torch). Use --speculative ngram or draft."
        )
    head = MtpHead.load(runner.model, weights, runner.dtype)  # evaluated at load, as the model is
    proposer = MtpProposer(head, token_limit, runner._thread_stream)
    runner.hidden_sink = proposer.file_step
    return proposer
