"""Batched sampling with MLX: grammar mask + logit_bias -> penalties -> greedy / temperature -> top-k
-> top-p -> min-p -> draw. Logprobs are reported from the raw logits, before any of these.

The same semantics as localchat/backends/torch/sampler.py, step for step. Draws use the exponential race
`argmax(probs / q)`, `q ~ Exp(1)`, which samples exactly from `probs`. A seeded request draws its `q`
from the key `mx.random.key(f(seed, token index))`, so its tokens depend neither on the batch nor on
preemption. Every per-request input comes from the engine (localchat/engine/sampling_inputs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from localchat.engine.constraint import constrained_rows, unpack_bitmask
from localchat.engine.interface import TokenLogprobs
from localchat.engine.sampling_inputs import SamplingInputs
from localchat.engine.spec_sampling import resolve_drafts

_SEED_MASK = 2**64 - 1


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None = field(default=None)


def new_key(seed: int) -> mx.array:
    """The runner's key for unseeded rows (its only sampling state)."""
    key = mx.random.key(seed & _SEED_MASK)
    mx.eval(key)  # made on the loading thread, used on the engine thread: nothing left pending
    return key


def sample(logits: mx.array, inputs: SamplingInputs, key: mx.array) -> tuple[SampleResult, mx.array]:
    """logits [N, vocab] (rows aligned with `inputs`) -> (one token per row, the next shared key).
    `key` draws the unseeded rows' noise; it is split only when such a row samples."""
    logits = logits.astype(mx.float32)
    raw = logits
    logits = _constrain(logits, inputs)
    penalized = inputs.penalized_rows
    if len(penalized):
        logits = _apply_penalties(logits, penalized, inputs)
    sampled = np.flatnonzero(inputs.temperature != 0)
    tokens = mx.argmax(logits, axis=-1)  # greedy rows keep this
    if len(sampled):
        tokens, key = _sample(logits, tokens, sampled, inputs, key)
    token_list = _ints(tokens)
    if not inputs.wants_logprobs:
        return SampleResult(token_list), key
    return SampleResult(token_list, _logprobs(raw, token_list, inputs.num_logprobs)), key


def _sample(
    logits: mx.array, tokens: mx.array, rows: np.ndarray, inputs: SamplingInputs, key: mx.array
) -> tuple[mx.array, mx.array]:
    index = mx.array(rows.astype(np.int32))
    temperature = mx.array(inputs.temperature[rows])[:, None]
    scaled = logits[index] / temperature
    scaled = _top_k(scaled, inputs.top_k[rows].tolist())
    scaled = _top_p(scaled, inputs.top_p[rows].tolist())
    probs = mx.softmax(scaled, axis=-1)  # [R, vocab]
    min_p = inputs.min_p[rows]
    if min_p.any():
        floor = mx.array(min_p)[:, None] * probs.max(axis=-1, keepdims=True)
        probs = mx.where(probs < floor, 0.0, probs)
    uniform, key = _uniform(rows, inputs, probs.shape[1], key)  # [R, vocab]
    # Exp(1) draws; a zero would turn a masked token's 0 / 0 into NaN, which argmax picks.
    noise = mx.maximum(-mx.log(uniform), np.finfo(np.float32).tiny)
    drawn = mx.argmax(probs / noise, axis=-1).astype(tokens.dtype)
    tokens[index] = drawn
    if inputs.spec_rows is not None:
        tokens, key = _verify_drafts(tokens, probs, noise, rows, inputs, key)
    return tokens, key


def _verify_drafts(
    tokens: mx.array,
    probs: mx.array,
    noise: mx.array,
    rows: np.ndarray,
    inputs: SamplingInputs,
    key: mx.array,
) -> tuple[mx.array, mx.array]:
    """Rows verifying a draft drawn from q: keep it with probability min(1, p/q), else draw from
    norm(max(0, p - q)) with the row's own noise (engine/spec_sampling.py; as the torch sampler)."""
    assert inputs.spec_rows is not None and inputs.spec_tokens is not None and inputs.spec_probs is not None
    at = mx.array(np.searchsorted(rows, inputs.spec_rows).astype(np.int32))  # spec rows always sample
    key, draw = mx.random.split(key)
    uniform = mx.random.uniform(shape=(len(inputs.spec_rows),), key=draw)
    chosen = resolve_drafts(
        np.asarray(probs[at], dtype=np.float32),
        np.asarray(noise[at], dtype=np.float32),
        np.asarray(uniform, dtype=np.float32),
        inputs.spec_tokens,
        inputs.spec_probs,
    )
    tokens[mx.array(inputs.spec_rows.astype(np.int32))] = mx.array(chosen).astype(tokens.dtype)
    return tokens, key


def _uniform(
    rows: np.ndarray, inputs: SamplingInputs, vocab: int, key: mx.array
) -> tuple[mx.array, mx.array]:
    """One row of U(0, 1) per sampled row: from its (seed, token index) key when seeded, else the shared key."""
    seeded = inputs.has_seed[rows]
    shared = None
    if not seeded.all():
        key, draw = mx.random.split(key)
        shared = mx.random.uniform(shape=(int((~seeded).sum()), vocab), key=draw)
    out = []
    next_shared = 0
    for j, row in enumerate(rows.tolist()):
        if seeded[j]:
            out.append(mx.random.uniform(shape=(vocab,), key=mx.random.key(inputs.draw_seed(row))))
        else:
            assert shared is not None
            out.append(shared[next_shared])
            next_shared += 1
    return mx.stack(out), key


def _ints(array: mx.array) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _rows(array: mx.array) -> list[list[float]]:
    return [[float(v) for v in row] for row in np.asarray(array, dtype=np.float32)]


def _constrain(logits: mx.array, inputs: SamplingInputs) -> mx.array:
    """Add each row's logit_bias, then set tokens the grammar forbids to -inf (same order as torch)."""
    if len(inputs.bias_token_ids):
        bias_rows, ids, values = inputs.bias_rows()
        in_vocab = ids < logits.shape[1]
        logits = logits.at[
            mx.array(bias_rows[in_vocab].astype(np.int32)), mx.array(ids[in_vocab].astype(np.int32))
        ].add(mx.array(values[in_vocab]))
    bitmask = inputs.token_bitmask
    rows = constrained_rows(bitmask)
    if len(rows):
        assert bitmask is not None
        allowed = np.ones(logits.shape, dtype=bool)  # unconstrained rows keep everything
        allowed[rows] = unpack_bitmask(bitmask[rows], logits.shape[1])
        logits = mx.where(mx.array(allowed), logits, -mx.inf)
    return logits


def _apply_penalties(logits: mx.array, rows: np.ndarray, inputs: SamplingInputs) -> mx.array:
    """Repetition (prompt + output, Hugging Face: divide positive logits, multiply negative ones), then
    frequency/presence (output only, OpenAI: subtract count * f + [count > 0] * p)."""
    index = mx.array(rows.astype(np.int32))
    sub = logits[index]
    seen_row, seen_id, out_row, out_id = (mx.array(a.astype(np.int32)) for a in inputs.penalty_rows(rows))
    seen = mx.zeros(sub.shape, dtype=mx.float32).at[seen_row, seen_id].add(1.0) > 0
    counts = mx.zeros(sub.shape, dtype=mx.float32).at[out_row, out_id].add(1.0)
    rep = mx.array(inputs.repetition_penalty[rows])[:, None]
    freq = mx.array(inputs.frequency_penalty[rows])[:, None]
    pres = mx.array(inputs.presence_penalty[rows])[:, None]
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


def _logprobs(raw: mx.array, tokens: list[int], num_logprobs: np.ndarray) -> list[TokenLogprobs | None]:
    """Sampled token's logprob under the raw model distribution, plus the top-k alternatives."""
    rows = np.flatnonzero(num_logprobs >= 0)
    sub = raw[mx.array(rows.astype(np.int32))]
    logprobs = sub - mx.logsumexp(sub, axis=-1, keepdims=True)  # [L, vocab]
    chosen = mx.take_along_axis(
        logprobs, mx.array([tokens[i] for i in rows.tolist()], dtype=mx.int32)[:, None], axis=1
    )
    k = int(num_logprobs[rows].max())
    ids: list[list[int]] = [[] for _ in rows]
    vals: list[list[float]] = [[] for _ in rows]
    if k > 0:
        top = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]  # [L, k], unordered
        top_vals = mx.take_along_axis(logprobs, top, axis=-1)
        rank = mx.argsort(-top_vals, axis=-1)
        ids = [[int(v) for v in row] for row in np.asarray(mx.take_along_axis(top, rank, axis=-1))]
        vals = _rows(mx.take_along_axis(top_vals, rank, axis=-1))
    chosen_list = [float(v) for v in np.asarray(chosen[:, 0], dtype=np.float32)]
    result: list[TokenLogprobs | None] = [None] * len(tokens)
    for j, i in enumerate(rows.tolist()):
        n = int(num_logprobs[i])
        result[i] = TokenLogprobs(tokens[i], chosen_list[j], list(zip(ids[j][:n], vals[j][:n], strict=True)))
    return result
