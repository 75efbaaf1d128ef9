"""Batched on-device sampling: grammar mask + logit_bias -> penalties -> greedy / temperature -> top-k
-> top-p -> min-p -> draw. Logprobs are reported from the raw logits, before any of these.

Draws use the exponential race `argmax(probs / q)`, `q ~ Exp(1)`, which samples exactly from `probs`.
A seeded request draws its `q` from a generator seeded for every token from (seed, token index): its
tokens depend neither on the batch nor on whether it was preempted and resumed. Every per-request input
comes from the engine (localchat/engine/sampling_inputs.py): `sample` keeps no state between steps.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import torch

from localchat.engine.constraint import constrained_rows, unpack_bitmask
from localchat.engine.interface import TokenLogprobs
from localchat.engine.sampling_inputs import SamplingInputs
from localchat.engine.spec_sampling import resolve_drafts
from localchat.kernels import library as c_library

_SEED_MASK = 2**64 - 1


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None = field(default=None)


def new_generator(device: torch.device, seed: int) -> torch.Generator:
    """The runner's generator for unseeded rows (its only sampling state)."""
    return torch.Generator(device=device).manual_seed(seed & _SEED_MASK)


def sample(logits: torch.Tensor, inputs: SamplingInputs, generator: torch.Generator) -> SampleResult:
    """logits [N, vocab] (rows aligned with `inputs`) -> one token per row; `generator` draws the
    unseeded rows' noise."""
    if _plain_greedy(inputs) and (greedy := greedy_tokens(logits)) is not None:
        return SampleResult(greedy)
    logits = logits.float()
    raw = logits
    logits = _constrain(logits, inputs)
    penalized = inputs.penalized_rows
    if len(penalized):
        logits = _apply_penalties(logits.clone(), penalized, inputs)
    sampled = np.flatnonzero(inputs.temperature != 0)
    # All-greedy batches (the common case) stop at one argmax.
    tokens = _sample(logits, sampled, inputs, generator) if len(sampled) else logits.argmax(dim=-1)
    token_list: list[int] = tokens.tolist()
    if not inputs.wants_logprobs:
        return SampleResult(token_list)
    return SampleResult(token_list, _logprobs(raw, token_list, inputs.num_logprobs))


# Per float width: its signed and unsigned integers of the same size, the magnitude bits, and the
# largest non-NaN magnitude (inf).
_BITS = {
    torch.bfloat16: (torch.int16, np.uint16, 0x7FFF, 0x7F80),
    torch.float32: (torch.int32, np.uint32, 0x7FFF_FFFF, 0x7F80_0000),
}


def _plain_greedy(inputs: SamplingInputs) -> bool:
    """Every row takes its argmax of the raw logits: greedy, no grammar, bias, penalty, logprobs or draft."""
    return (
        inputs.token_bitmask is None
        and inputs.spec_rows is None
        and not len(inputs.bias_token_ids)
        and inputs.all_greedy  # worked out once for shared inputs (SamplingInputs.derived)
        and not len(inputs.penalized_rows)
        and not inputs.wants_logprobs
    )


def greedy_tokens(logits: torch.Tensor) -> list[int] | None:
    """Each row's argmax, as `logits.float().argmax(dim=-1)` gives it (the first of equal maxima), read
    from the floats' bits: positive floats order as their bit patterns do as signed integers, below
    every negative one, so where a row's largest pattern is a positive number (real logits: always) that
    pattern's first index is the answer; one more pass over the patterns as unsigned integers rules out
    a negative NaN. Two SIMD reductions in numpy against torch's float copy and argmax: ~2x less on a
    152k vocabulary; where the compiled kernels are built, one C pass (csrc/lc_argmax.h) answers first.
    Rows whose maximum is not positive take the exact slow order (`_greedy_keys`).
    None off the CPU, for other dtypes, and when a row holds a NaN (torch's argmax picks the first NaN:
    left to it).
    Tried and not kept (2026-11-30): the LM head's threads folding the logits they store into this
    argmax, so that this thread never reads the row: ~0.1 ms a token less in process, nothing measurable
    over HTTP, and more than this at 4+ rows (docs/performance.md)."""
    kind = _BITS.get(logits.dtype)
    if kind is None or logits.device.type != "cpu" or logits.dim() != 2 or not logits.is_contiguous():
        return None
    if (one_pass := c_library.optional("lc_argmax_rows")) is not None:
        # One pass of the compiled kernels over each row (csrc/lc_argmax.h): this order, with the NaN
        # checks folded in: 110 -> 69 µs a token against numpy's calls on the caches a step leaves (#34).
        # Rows it leaves (-1: a NaN, a maximum not positive) take the paths below.
        rows, cols = logits.shape
        found = (ctypes.c_int64 * rows)()
        done = rows and not one_pass(logits.data_ptr(), 8 * logits.element_size(), rows, cols, found)
        if done and min(found) >= 0:
            return list(found)
    int_type, unsigned, magnitude, inf = kind
    bits = logits.view(int_type).numpy()
    if bits.shape[0] == 1:
        # One stream's step: the same two reductions, then scalar checks instead of take_along_axis and
        # three more array ops (this runs on caches the weights just swept: ~20 µs of numpy calls, #34).
        row = bits[0]
        first = int(row.argmax())
        if 0 < int(row[first]) <= inf and int(row.view(unsigned).max()) <= (magnitude + 1) | inf:
            return [first]
    best = bits.argmax(axis=-1)
    top = np.take_along_axis(bits, best[:, None], axis=-1)
    if bits.view(unsigned).max() > (magnitude + 1) | inf:
        return None  # a negative NaN
    if (top > inf).any():
        return None  # a positive NaN
    if (top > 0).all():
        return best.tolist()
    return _greedy_keys(bits, magnitude)


def _greedy_keys(bits: np.ndarray, magnitude: int) -> list[int]:
    """The argmax of NaN-free float bit patterns whose maximum may be zero or negative: a negative
    float's magnitude bits flipped (and -0.0 moved onto +0.0) order every float as an integer."""
    sign = bits >> (8 * bits.itemsize - 1)  # -1 for a negative float, else 0
    keys = bits ^ (sign & magnitude)
    keys -= sign
    return keys.argmax(axis=-1).tolist()


def _sample(
    logits: torch.Tensor, rows: np.ndarray, inputs: SamplingInputs, generator: torch.Generator
) -> torch.Tensor:
    device = logits.device
    tokens = logits.argmax(dim=-1)  # greedy rows keep this
    index = _tensor(rows, device)
    scaled = logits[index] / _tensor(inputs.temperature[rows], device)[:, None]
    scaled = _top_k(scaled, inputs.top_k[rows].tolist())
    scaled = _top_p(scaled, inputs.top_p[rows].tolist())
    probs = torch.softmax(scaled, dim=-1)  # [R, vocab]
    min_p = inputs.min_p[rows]
    if min_p.any():
        floor = _tensor(min_p, device)[:, None] * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
    noise = torch.empty_like(probs)
    seeded = inputs.has_seed[rows]
    unseeded = np.flatnonzero(~seeded)
    if len(unseeded):
        shared = torch.empty((len(unseeded), probs.shape[1]), device=device)
        noise[_tensor(unseeded, device)] = shared.exponential_(generator=generator)
    if seeded.any():
        own = torch.Generator(device=device)
        for j in np.flatnonzero(seeded).tolist():
            noise[j].exponential_(generator=own.manual_seed(inputs.draw_seed(int(rows[j]))))
    # A zero draw would turn a masked token's 0 / 0 into NaN, which argmax picks.
    tokens[index] = (probs / noise.clamp_(min=torch.finfo(noise.dtype).tiny)).argmax(dim=-1)
    if inputs.spec_rows is not None:
        _verify_drafts(tokens, probs, noise, rows, inputs, generator)
    return tokens


def _verify_drafts(
    tokens: torch.Tensor,
    probs: torch.Tensor,
    noise: torch.Tensor,
    rows: np.ndarray,
    inputs: SamplingInputs,
    generator: torch.Generator,
) -> None:
    """Rows verifying a draft drawn from q: keep it with probability min(1, p/q), else draw from
    norm(max(0, p - q)) with the row's own noise (engine/spec_sampling.py)."""
    assert inputs.spec_rows is not None and inputs.spec_tokens is not None and inputs.spec_probs is not None
    at = _tensor(np.searchsorted(rows, inputs.spec_rows), probs.device)  # spec rows always sample
    uniform = torch.rand(len(inputs.spec_rows), generator=generator, device=generator.device)
    chosen = resolve_drafts(
        probs[at].cpu().numpy(),
        noise[at].cpu().numpy(),
        uniform.cpu().numpy(),
        inputs.spec_tokens,
        inputs.spec_probs,
    )
    tokens[_tensor(inputs.spec_rows, tokens.device)] = torch.tensor(chosen, device=tokens.device)


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


def _constrain(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """Add each row's logit_bias, then set tokens the grammar forbids to -inf (same order as MLX)."""
    bitmask = inputs.token_bitmask
    rows = constrained_rows(bitmask)
    biased = len(inputs.bias_token_ids) > 0
    if not biased and not len(rows):
        return logits
    if biased:
        bias_rows, ids, values = inputs.bias_rows()
        in_vocab = ids < logits.shape[1]
        logits = logits.clone()
        logits.index_put_(
            (_tensor(bias_rows[in_vocab], logits.device), _tensor(ids[in_vocab], logits.device)),
            _tensor(values[in_vocab], logits.device),
            accumulate=True,
        )
    if len(rows):
        assert bitmask is not None
        # Unpacked by numpy (the reference both samplers share), sent as bool [R, vocab].
        allowed = _tensor(unpack_bitmask(bitmask[rows], logits.shape[1]), logits.device)
        if len(rows) == logits.shape[0]:
            return logits.masked_fill(~allowed, float("-inf"))
        index = _tensor(rows, logits.device)
        logits = logits if biased else logits.clone()
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return logits


def _apply_penalties(logits: torch.Tensor, rows: np.ndarray, inputs: SamplingInputs) -> torch.Tensor:
    """Repetition (prompt + output, Hugging Face: divide positive logits, multiply negative ones), then
    frequency/presence (output only, OpenAI: subtract count * f + [count > 0] * p)."""
    device = logits.device
    index = _tensor(rows, device)
    sub = logits[index]
    seen_row, seen_id, out_row, out_id = (_tensor(a, device) for a in inputs.penalty_rows(rows))
    seen = torch.zeros(sub.shape, dtype=torch.bool, device=device)
    seen[seen_row, seen_id] = True
    counts = torch.zeros_like(sub)
    counts.index_put_((out_row, out_id), torch.ones(len(out_id), device=device), accumulate=True)
    rep = _tensor(inputs.repetition_penalty[rows], device)[:, None]
    freq = _tensor(inputs.frequency_penalty[rows], device)[:, None]
    pres = _tensor(inputs.presence_penalty[rows], device)[:, None]
    sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    sub = sub - counts * freq - (counts > 0).float() * pres
    logits[index] = sub
    return logits


def _top_k(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    vocab = logits.shape[1]
    ks = [k if 0 < k < vocab else 0 for k in ks]
    if not any(ks):
        return logits
    top = torch.topk(logits, max(ks), dim=-1).values  # [R, max_k], descending
    kth = top.gather(1, torch.tensor([max(k, 1) - 1 for k in ks], device=logits.device)[:, None])
    kth = kth.masked_fill(torch.tensor([k == 0 for k in ks], device=logits.device)[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (always at least one)."""
    if all(p >= 1.0 for p in ps):
        return logits
    # After top-k (or a grammar) few tokens are left: order only those, not the whole vocabulary (a 152k
    # vocabulary's sort took ~8 ms of a ~90 ms decode step); masked tokens have no mass to add.
    candidates = int((logits != float("-inf")).sum(dim=-1).max())
    if 0 < candidates < logits.shape[1]:
        ordered, order = torch.topk(logits, candidates, dim=-1)
    else:
        ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # p = 1 keeps everything: the float cumsum may reach 1.0 before the tail, so never compare against it.
    limits = torch.tensor([p if p < 1.0 else float("inf") for p in ps], device=logits.device)
    drop = mass_before >= limits[:, None]
    drop[:, 0] = False
    mask = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device).scatter_(1, order, drop)
    return logits.masked_fill(mask, float("-inf"))


def _logprobs(raw: torch.Tensor, tokens: list[int], num_logprobs: np.ndarray) -> list[TokenLogprobs | None]:
    """Sampled token's logprob under the raw model distribution, plus the top-k alternatives."""
    rows = np.flatnonzero(num_logprobs >= 0)
    index = _tensor(rows, raw.device)
    logprobs = torch.log_softmax(raw[index], dim=-1)  # [L, vocab]
    chosen = logprobs.gather(1, torch.tensor([tokens[i] for i in rows.tolist()], device=raw.device)[:, None])
    k = int(num_logprobs[rows].max())
    top_vals, top_ids = torch.topk(logprobs, k, dim=-1)  # [L, k], k may be 0
    chosen_list, vals, ids = chosen[:, 0].tolist(), top_vals.tolist(), top_ids.tolist()
    result: list[TokenLogprobs | None] = [None] * len(tokens)
    for j, i in enumerate(rows.tolist()):
        n = int(num_logprobs[i])
        result[i] = TokenLogprobs(tokens[i], chosen_list[j], list(zip(ids[j][:n], vals[j][:n], strict=True)))
    return result
