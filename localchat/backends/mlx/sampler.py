"""Batched sampling with MLX: grammar mask + logit_bias -> penalties -> greedy / temperature -> top-k
-> top-p -> min-p -> draw. Logprobs are reported from the raw logits, before any of these.

The same semantics as localchat/backends/torch/sampler.py, step for step. Draws use the exponential race
`argmax(probs / q)`, `q ~ Exp(1)`, which samples exactly from `probs`. A seeded request draws its `q`
from its own key `mx.random.key(seed)`, split once per sampled token, so its tokens depend neither on
the batch nor on preemption (a resumed request first advances its key past the tokens it has).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from localchat.engine.constraint import constrained_rows, unpack_bitmask
from localchat.engine.interface import TokenLogprobs
from localchat.engine.sampling_params import SamplingParams

_SEED_MASK = 2**64 - 1


@dataclass(slots=True)
class RequestSampling:
    """The runner's per-request sampling state."""

    params: SamplingParams
    key: mx.array | None = None  # only when params.seed is set; split once per draw
    seen: mx.array | None = None  # bool [vocab]: in prompt or output (repetition penalty)
    output_counts: mx.array | None = None  # float32 [vocab]: occurrences in the output
    bias: mx.array | None = None  # float32 [vocab]: logit_bias as a dense row (-inf where banned)

    @classmethod
    def create(
        cls, params: SamplingParams, prompt: list[int], output: list[int], vocab_size: int
    ) -> RequestSampling:
        state = cls(params)
        if params.seed is not None:
            state.key = mx.random.key(params.seed & _SEED_MASK)
            if not params.greedy:
                for _ in output:  # one draw per token already sampled before a preemption
                    state.next_key()
                mx.eval(state.key)
        if params.needs_penalties:
            seen = mx.zeros(vocab_size, dtype=mx.bool_)
            seen[mx.array(prompt + output, dtype=mx.int32)] = True
            counts = mx.zeros(vocab_size, dtype=mx.float32)
            if output:
                counts = counts.at[mx.array(output, dtype=mx.int32)].add(1.0)
            state.seen, state.output_counts = seen, counts
        if params.logit_bias:
            state.bias = mx.array(_bias_row(params.logit_bias, vocab_size))
        return state

    def next_key(self) -> mx.array:
        assert self.key is not None
        self.key, draw = mx.random.split(self.key)
        return draw

    def record(self, token: int) -> None:
        if self.seen is not None and self.output_counts is not None:
            self.seen[token] = True
            self.output_counts[token] += 1.0


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None = field(default=None)


class Sampler:
    def __init__(self, seed: int) -> None:
        self.key = mx.random.key(seed & _SEED_MASK)  # shared by unseeded requests
        mx.eval(self.key)  # made on the loading thread, used on the engine thread: nothing left pending

    def __call__(
        self, logits: mx.array, states: list[RequestSampling], bitmask: np.ndarray | None = None
    ) -> SampleResult:
        """logits [N, vocab] (rows aligned with `states`) -> one token per row. `bitmask` int32
        [N, words]: the grammar's allowed tokens per row (layout: localchat/engine/constraint.py)."""
        logits = logits.astype(mx.float32)
        params = [s.params for s in states]
        raw = logits
        logits = _constrain(logits, states, bitmask)
        penalized = [i for i, p in enumerate(params) if p.needs_penalties]
        if penalized:
            logits = _apply_penalties(logits, penalized, states)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        tokens = mx.argmax(logits, axis=-1)  # greedy rows keep this
        if sampled:
            tokens = self._sample(logits, tokens, sampled, states)
        token_list = tokens.tolist()
        for i in penalized:
            states[i].record(token_list[i])
        if all(p.logprobs is None for p in params):
            return SampleResult(token_list)
        return SampleResult(token_list, _logprobs(raw, token_list, params))

    def _sample(
        self, logits: mx.array, tokens: mx.array, rows: list[int], states: list[RequestSampling]
    ) -> mx.array:
        params = [states[i].params for i in rows]
        index = mx.array(rows, dtype=mx.int32)
        temperature = mx.array([p.temperature for p in params], dtype=mx.float32)[:, None]
        scaled = logits[index] / temperature
        scaled = _top_k(scaled, [p.top_k for p in params])
        scaled = _top_p(scaled, [p.top_p for p in params])
        probs = mx.softmax(scaled, axis=-1)  # [R, vocab]
        min_p = [p.min_p for p in params]
        if any(m > 0 for m in min_p):
            floor = mx.array(min_p, dtype=mx.float32)[:, None] * probs.max(axis=-1, keepdims=True)
            probs = mx.where(probs < floor, 0.0, probs)
        uniform = self._uniform(rows, states, probs.shape[1])  # [R, vocab]
        # Exp(1) draws; a zero would turn a masked token's 0 / 0 into NaN, which argmax picks.
        noise = mx.maximum(-mx.log(uniform), np.finfo(np.float32).tiny)
        drawn = mx.argmax(probs / noise, axis=-1).astype(tokens.dtype)
        tokens[index] = drawn
        return tokens

    def _uniform(self, rows: list[int], states: list[RequestSampling], vocab: int) -> mx.array:
        """One row of U(0, 1) per sampled request: its own key when seeded, the shared key otherwise."""
        unseeded = [j for j, i in enumerate(rows) if states[i].key is None]
        shared = None
        if unseeded:
            self.key, draw = mx.random.split(self.key)
            shared = mx.random.uniform(shape=(len(unseeded), vocab), key=draw)
        out = []
        next_shared = 0
        for i in rows:
            state = states[i]
            if state.key is None:
                assert shared is not None
                out.append(shared[next_shared])
                next_shared += 1
            else:
                out.append(mx.random.uniform(shape=(vocab,), key=state.next_key()))
        return mx.stack(out)


def _bias_row(logit_bias: dict[int, float], vocab_size: int) -> np.ndarray:
    """Dense float32 [vocab] bias; -100 (the floor) bans: -inf."""
    row = np.zeros(vocab_size, dtype=np.float32)
    for token_id, bias in logit_bias.items():
        if token_id < vocab_size:
            row[token_id] += bias if bias > -100.0 else -np.inf
    return row


def _constrain(logits: mx.array, states: list[RequestSampling], bitmask: np.ndarray | None) -> mx.array:
    """Add each row's logit_bias, then set tokens the grammar forbids to -inf (same order as torch)."""
    if any(s.bias is not None for s in states):
        zeros = mx.zeros((logits.shape[1],), dtype=mx.float32)
        logits = logits + mx.stack([s.bias if s.bias is not None else zeros for s in states])
    rows = constrained_rows(bitmask)
    if len(rows):
        assert bitmask is not None
        allowed = np.ones(logits.shape, dtype=bool)  # unconstrained rows keep everything
        allowed[rows] = unpack_bitmask(bitmask[rows], logits.shape[1])
        logits = mx.where(mx.array(allowed), logits, -mx.inf)
    return logits


def _apply_penalties(logits: mx.array, rows: list[int], states: list[RequestSampling]) -> mx.array:
    """Repetition (prompt + output, Hugging Face: divide positive logits, multiply negative ones), then
    frequency/presence (output only, OpenAI: subtract count * f + [count > 0] * p)."""
    index = mx.array(rows, dtype=mx.int32)
    seen = mx.stack([states[i].seen for i in rows])  # type: ignore[misc]  # [R, vocab]
    counts = mx.stack([states[i].output_counts for i in rows])  # type: ignore[misc]
    params = [states[i].params for i in rows]
    rep = mx.array([p.repetition_penalty for p in params], dtype=mx.float32)[:, None]
    freq = mx.array([p.frequency_penalty for p in params], dtype=mx.float32)[:, None]
    pres = mx.array([p.presence_penalty for p in params], dtype=mx.float32)[:, None]
    sub = logits[index]
    sub = mx.where(seen, mx.where(sub > 0, sub / rep, sub * rep), sub)
    sub = sub - counts * freq - (counts > 0).astype(mx.float32) * pres
    out = mx.array(logits)
    out[index] = sub
    return out


def _top_k(logits: mx.array, ks: list[int]) -> mx.array:
    vocab = logits.shape[1]
    ks = [k if 0 < k < vocab else 0 for k in ks]
    if not any(ks):
        return logits
    ordered = -mx.sort(-logits, axis=-1)  # [R, vocab], descending
    kth = mx.take_along_axis(ordered, mx.array([max(k, 1) - 1 for k in ks], dtype=mx.int32)[:, None], axis=1)
    kth = mx.where(mx.array([k == 0 for k in ks])[:, None], -mx.inf, kth)
    return mx.where(logits < kth, -mx.inf, logits)


def _top_p(logits: mx.array, ps: list[float]) -> mx.array:
    """Keep the smallest set of most likely tokens whose mass reaches p (always at least one)."""
    if all(p >= 1.0 for p in ps):
        return logits
    order = mx.argsort(-logits, axis=-1)  # [R, vocab], most likely first
    ordered = mx.take_along_axis(logits, order, axis=-1)
    probs = mx.softmax(ordered, axis=-1)
    mass_before = mx.cumsum(probs, axis=-1) - probs
    # NOTE: rows with p == 1 drop nothing, even where float cumsum reaches 1.0 before the tail.
    p = mx.array(ps, dtype=mx.float32)[:, None]
    drop = (mass_before >= p) & (p < 1.0)
    drop[:, 0] = False
    dropped = mx.put_along_axis(mx.zeros(drop.shape, dtype=mx.bool_), order, drop, axis=-1)
    return mx.where(dropped, -mx.inf, logits)


def _logprobs(raw: mx.array, tokens: list[int], params: list[SamplingParams]) -> list[TokenLogprobs | None]:
    """Sampled token's logprob under the raw model distribution, plus the top-k alternatives."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    sub = raw[mx.array(rows, dtype=mx.int32)]
    logprobs = sub - mx.logsumexp(sub, axis=-1, keepdims=True)  # [L, vocab]
    chosen = mx.take_along_axis(
        logprobs, mx.array([tokens[i] for i in rows], dtype=mx.int32)[:, None], axis=1
    )
    k = max(params[i].logprobs or 0 for i in rows)
    ids: list[list[int]] = [[] for _ in rows]
    vals: list[list[float]] = [[] for _ in rows]
    if k > 0:
        top = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]  # [L, k], unordered
        top_vals = mx.take_along_axis(logprobs, top, axis=-1)
        rank = mx.argsort(-top_vals, axis=-1)
        ids = mx.take_along_axis(top, rank, axis=-1).tolist()
        vals = mx.take_along_axis(top_vals, rank, axis=-1).tolist()
    chosen_list = chosen[:, 0].tolist()
    result: list[TokenLogprobs | None] = [None] * len(params)
    for j, i in enumerate(rows):
        n = params[i].logprobs or 0
        result[i] = TokenLogprobs(tokens[i], chosen_list[j], list(zip(ids[j][:n], vals[j][:n], strict=True)))
    return result
