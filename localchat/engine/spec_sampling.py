"""Speculative sampling with a real draft distribution q (numpy, shared by the torch and MLX samplers).

A draft model that samples (engine/draft_model.py) draws each draft d from its own processed
distribution q, the request's sampling settings applied to the draft's logits (`processed_probs`, the
same pipeline as the samplers: logit_bias and grammar mask, penalties, temperature, top-k, top-p,
min-p). The target's row for that position then keeps d with probability min(1, p(d) / q(d)) and
otherwise draws from norm(max(0, p - q)) (`resolve_drafts`): the standard rule, under which every kept
token is distributed exactly as p (Leviathan et al., Chen et al., 2023). A rejected draft is never the
residual's draw (p(d) < q(d) there), so the engine's "kept while equal" walk (speculative.accept_drafts)
applies unchanged.
"""

from __future__ import annotations

import numpy as np

from localchat.engine.constraint import constrained_rows, unpack_bitmask
from localchat.engine.sampling_inputs import SamplingInputs

TOP_P_CANDIDATES = 1024


def processed_probs(logits: np.ndarray, inputs: SamplingInputs) -> np.ndarray:
    """float64 [N, vocab]: each row's sampling distribution (rows with temperature > 0), normalised.
    Greedy rows (temperature 0) are one-hot at their argmax."""
    x = np.array(logits, dtype=np.float64)  # a copy: penalties and masks write into it
    n, vocab = x.shape
    if len(inputs.bias_token_ids):
        rows, ids, values = inputs.bias_rows()
        keep = ids < vocab
        np.add.at(x, (rows[keep], ids[keep]), values[keep].astype(np.float64))
    masked = constrained_rows(inputs.token_bitmask)
    if len(masked):
        assert inputs.token_bitmask is not None
        allowed = unpack_bitmask(inputs.token_bitmask[masked], vocab)
        x[masked] = np.where(allowed, x[masked], -np.inf)
    penalized = inputs.penalized_rows
    if len(penalized):
        _penalize(x, penalized, inputs)
    out = np.zeros((n, vocab), dtype=np.float64)
    for i in range(n):
        t = float(inputs.temperature[i])
        if t == 0:
            out[i, int(np.argmax(x[i]))] = 1.0
            continue
        row = _top_p(_top_k(x[i] / t, int(inputs.top_k[i])), float(inputs.top_p[i]))
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        min_p = float(inputs.min_p[i])
        if min_p > 0:
            probs[probs < min_p * probs.max()] = 0.0
            probs /= probs.sum()
        out[i] = probs
    return out


def resolve_drafts(
    probs: np.ndarray, noise: np.ndarray, uniform: np.ndarray, drafts: np.ndarray, q: np.ndarray
) -> list[int]:
    """The token of each verification row under the speculative-sampling rule.

    probs [M, vocab]: the target's distribution per row (min-p may leave it unnormalised); noise
    [M, vocab]: that row's Exp(1) draws (already drawn for its own sample, which this replaces, so
    independent of `uniform`); uniform [M]: U(0, 1); drafts [M]; q [M, draft vocab]: the draft's
    distribution each draft was drawn from. Returns the draft where kept, else a residual draw."""
    sums = np.asarray(probs).sum(axis=1, dtype=np.float64)
    vocab = probs.shape[1]
    width = min(vocab, q.shape[1])
    out: list[int] = []
    for i, draft in enumerate(np.asarray(drafts).tolist()):
        # Strictly less: a token the target gives 0 is never kept, even with u = 0.
        if draft < width and uniform[i] * float(q[i, draft]) < float(probs[i, draft]) / sums[i]:
            out.append(int(draft))
            continue
        p = np.asarray(probs[i], dtype=np.float64) / sums[i]
        residual = p.copy()
        residual[:width] -= q[i, :width]
        np.maximum(residual, 0.0, out=residual)
        if not residual.sum() > 0:  # only by rounding (p <= q everywhere): p itself
            residual = p
        out.append(int(np.argmax(residual / np.maximum(noise[i], np.finfo(np.float64).tiny))))
    return out


def draw(q: np.ndarray, rng: np.random.Generator) -> int:
    """One token from the distribution q (inverse CDF)."""
    cdf = np.cumsum(q)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(q) - 1))


def _penalize(x: np.ndarray, rows: np.ndarray, inputs: SamplingInputs) -> None:
    """Repetition (prompt + output), then frequency / presence (output only), as the samplers do."""
    seen_row, seen_id, out_row, out_id = inputs.penalty_rows(rows)
    for j, i in enumerate(rows.tolist()):
        row = x[i]
        seen = np.unique(seen_id[seen_row == j])
        rep = float(inputs.repetition_penalty[i])
        vals = row[seen]
        row[seen] = np.where(vals > 0, vals / rep, vals * rep)
        counts = np.bincount(out_id[out_row == j], minlength=len(row))[: len(row)].astype(np.float64)
        row -= counts * float(inputs.frequency_penalty[i]) + (counts > 0) * float(inputs.presence_penalty[i])


def _top_k(row: np.ndarray, k: int) -> np.ndarray:
    if not 0 < k < len(row):
        return row
    kth = np.partition(row, len(row) - k)[len(row) - k]
    return np.where(row < kth, -np.inf, row)


def _top_p(row: np.ndarray, p: float) -> np.ndarray:
    """The smallest set of most likely tokens whose mass reaches p (at least one), as the samplers.
    Only the most likely TOP_P_CANDIDATES are sorted when they already hold p (a 152k vocabulary's
    full sort cost tens of ms per row); else all are."""
    if p >= 1.0:
        return row
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    order = None
    if len(row) > TOP_P_CANDIDATES:
        top = np.argpartition(-probs, TOP_P_CANDIDATES - 1)[:TOP_P_CANDIDATES]
        order = top[np.argsort(-probs[top], kind="stable")]
        if probs[order].sum() < p:
            order = None  # the cut lies past the candidates
    if order is None:
        order = np.argsort(-probs, kind="stable")
    ordered = probs[order]
    keep = order[np.cumsum(ordered) - ordered < p]
    out = np.full_like(row, -np.inf)
    out[order[0]] = row[order[0]]
    out[keep] = row[keep]
    return out
