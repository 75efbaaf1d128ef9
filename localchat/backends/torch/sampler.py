"""Batched on-device sampling: grammar mask + logit_bias -> penalties -> greedy / temperature -> top-k
-> top-p -> min-p -> draw. Logprobs are reported from the raw logits, before any of these.

Draws use the exponential race `argmax(probs / q)`, `q ~ Exp(1)`, which samples exactly from `probs`.
A seeded request draws its `q` from its own generator, reseeded for every token from (seed, token index):
its tokens depend neither on the batch nor on whether it was preempted and resumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from localchat.engine.constraint import constrained_rows, unpack_bitmask
from localchat.engine.interface import TokenLogprobs
from localchat.engine.sampling_params import SamplingParams

_SEED_MASK = 2**64 - 1
_SEED_STRIDE = 1_000_003  # spreads (seed, token index) pairs over the seed space


@dataclass(slots=True)
class RequestSampling:
    """The runner's per-request sampling state."""

    params: SamplingParams
    generator: torch.Generator | None = None  # only when params.seed is set
    num_output: int = 0  # tokens generated so far (after a preemption: including those before it)
    seen: torch.Tensor | None = None  # bool [vocab]: in prompt or output (repetition penalty)
    output_counts: torch.Tensor | None = None  # float [vocab]: occurrences in the output
    bias_ids: torch.Tensor | None = None  # long [B]: logit_bias token ids
    bias_values: torch.Tensor | None = None  # float [B]: their biases (-inf where banned)

    @classmethod
    def create(
        cls,
        params: SamplingParams,
        prompt: list[int],
        output: list[int],
        vocab_size: int,
        device: torch.device,
    ) -> RequestSampling:
        state = cls(params, num_output=len(output))
        if params.seed is not None:
            state.generator = torch.Generator(device=device)
        if params.needs_penalties:
            state.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            state.seen[torch.tensor(prompt + output, dtype=torch.long, device=device)] = True
            out = torch.tensor(output, dtype=torch.long, device=device)
            state.output_counts = torch.bincount(out, minlength=vocab_size).float()
        if params.logit_bias:
            ids, values = _bias_arrays(params.logit_bias, vocab_size)
            state.bias_ids = torch.from_numpy(ids).to(device)
            state.bias_values = torch.from_numpy(values).to(device)
        return state

    def next_generator(self) -> torch.Generator:
        """This token's generator: a pure function of (seed, token index), so a resumed request draws
        exactly what it would have drawn without the preemption."""
        assert self.generator is not None and self.params.seed is not None
        return self.generator.manual_seed((self.params.seed * _SEED_STRIDE + self.num_output) & _SEED_MASK)

    def record(self, token: int) -> None:
        self.num_output += 1
        if self.seen is not None and self.output_counts is not None:
            self.seen[token] = True
            self.output_counts[token] += 1


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None = field(default=None)


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed & _SEED_MASK)

    def __call__(
        self, logits: torch.Tensor, states: list[RequestSampling], bitmask: np.ndarray | None = None
    ) -> SampleResult:
        """logits [N, vocab] (rows aligned with `states`) -> one token per row. `bitmask` int32
        [N, words]: the grammar's allowed tokens per row (layout: localchat/engine/constraint.py)."""
        logits = logits.float()
        params = [s.params for s in states]
        want_logprobs = [p.logprobs is not None for p in params]
        raw = logits
        logits = _constrain(logits, states, bitmask)
        penalized = [i for i, p in enumerate(params) if p.needs_penalties]
        if penalized:
            logits = _apply_penalties(logits.clone(), penalized, states)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        # All-greedy batches (the common case) stop at one argmax.
        tokens = self._sample(logits, sampled, states) if sampled else logits.argmax(dim=-1)
        token_list = tokens.tolist()
        for state, token in zip(states, token_list, strict=True):
            state.record(token)
        if not any(want_logprobs):
            return SampleResult(token_list)
        return SampleResult(token_list, _logprobs(raw, token_list, params))

    def _sample(self, logits: torch.Tensor, rows: list[int], states: list[RequestSampling]) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)  # greedy rows keep this
        params = [states[i].params for i in rows]
        index = torch.tensor(rows, device=self.device)
        scaled = logits[index] / torch.tensor([p.temperature for p in params], device=self.device)[:, None]
        scaled = _top_k(scaled, [p.top_k for p in params])
        scaled = _top_p(scaled, [p.top_p for p in params])
        probs = torch.softmax(scaled, dim=-1)  # [R, vocab]
        min_p = [p.min_p for p in params]
        if any(m > 0 for m in min_p):
            floor = torch.tensor(min_p, device=self.device)[:, None] * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < floor, 0.0)
        noise = torch.empty_like(probs)
        unseeded = [j for j, i in enumerate(rows) if states[i].generator is None]
        if unseeded:
            shared = torch.empty((len(unseeded), probs.shape[1]), device=self.device)
            noise[unseeded] = shared.exponential_(generator=self.generator)
        for j, i in enumerate(rows):
            if states[i].generator is not None:
                noise[j].exponential_(generator=states[i].next_generator())
        # A zero draw would turn a masked token's 0 / 0 into NaN, which argmax picks.
        tokens[index] = (probs / noise.clamp_(min=torch.finfo(noise.dtype).tiny)).argmax(dim=-1)
        return tokens


def _bias_arrays(logit_bias: dict[int, float], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64, biases float32) of the in-vocabulary entries; -100 (the floor) bans: -inf."""
    items = [(t, b) for t, b in logit_bias.items() if t < vocab_size]
    ids = np.array([t for t, _ in items], dtype=np.int64)
    values = np.array([b if b > -100.0 else -np.inf for _, b in items], dtype=np.float32)
    return ids, values


def _constrain(
    logits: torch.Tensor, states: list[RequestSampling], bitmask: np.ndarray | None
) -> torch.Tensor:
    """Add each row's logit_bias, then set tokens the grammar forbids to -inf (same order as MLX)."""
    biased = [i for i, s in enumerate(states) if s.bias_ids is not None]
    rows = constrained_rows(bitmask)
    if not biased and not len(rows):
        return logits
    if biased:
        logits = logits.clone()
        for i in biased:
            logits[i].index_add_(0, states[i].bias_ids, states[i].bias_values)  # type: ignore[arg-type]
    if len(rows):
        assert bitmask is not None
        # Unpacked by numpy (the reference both samplers share), sent as bool [R, vocab].
        allowed = torch.from_numpy(unpack_bitmask(bitmask[rows], logits.shape[1])).to(logits.device)
        if len(rows) == logits.shape[0]:
            return logits.masked_fill(~allowed, float("-inf"))
        index = torch.from_numpy(rows).to(logits.device)
        logits = logits if biased else logits.clone()
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return logits


def _apply_penalties(logits: torch.Tensor, rows: list[int], states: list[RequestSampling]) -> torch.Tensor:
    """Repetition (prompt + output, Hugging Face: divide positive logits, multiply negative ones), then
    frequency/presence (output only, OpenAI: subtract count * f + [count > 0] * p)."""
    device = logits.device
    index = torch.tensor(rows, device=device)
    seen = torch.stack([states[i].seen for i in rows])  # type: ignore[misc]
    counts = torch.stack([states[i].output_counts for i in rows])  # type: ignore[misc]
    params = [states[i].params for i in rows]
    rep = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
    freq = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    pres = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    sub = logits[index]
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
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # p = 1 keeps everything: the float cumsum may reach 1.0 before the tail, so never compare against it.
    limits = torch.tensor([p if p < 1.0 else float("inf") for p in ps], device=logits.device)
    drop = mass_before >= limits[:, None]
    drop[:, 0] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter_(1, order, drop), float("-inf"))


def _logprobs(
    raw: torch.Tensor, tokens: list[int], params: list[SamplingParams]
) -> list[TokenLogprobs | None]:
    """Sampled token's logprob under the raw model distribution, plus the top-k alternatives."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    index = torch.tensor(rows, device=raw.device)
    logprobs = torch.log_softmax(raw[index], dim=-1)  # [L, vocab]
    chosen = logprobs.gather(1, torch.tensor([tokens[i] for i in rows], device=raw.device)[:, None])
    k = max(params[i].logprobs or 0 for i in rows)
    top_vals, top_ids = torch.topk(logprobs, k, dim=-1)  # [L, k], k may be 0
    chosen_list, vals, ids = chosen[:, 0].tolist(), top_vals.tolist(), top_ids.tolist()
    result: list[TokenLogprobs | None] = [None] * len(params)
    for j, i in enumerate(rows):
        n = params[i].logprobs or 0
        result[i] = TokenLogprobs(tokens[i], chosen_list[j], list(zip(ids[j][:n], vals[j][:n], strict=True)))
    return result
