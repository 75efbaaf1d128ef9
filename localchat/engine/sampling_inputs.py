"""One step's sampling inputs as numpy arrays, one row per sampled request (aligned with
`BatchInputs.sample_req_ids`), built by the engine from the requests it owns.

The samplers (localchat/backends/*/sampler.py) are pure functions of these arrays and the logits: the
runners keep no per-request sampling state, so nothing has to follow add / preempt / resume / finish.
Variable-length data (penalty tokens, logit_bias) is CSR: row i owns `data[indptr[i]:indptr[i + 1]]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localchat.engine.sampling_params import SamplingParams

_SEED_MASK = 2**64 - 1
_SEED_STRIDE = 1_000_003  # spreads (seed, token index) pairs over the seed space
BANNED_BIAS = -100.0  # logit_bias at OpenAI's floor bans the token: it becomes -inf


@dataclass(slots=True)
class SamplingInputs:
    temperature: np.ndarray  # float32 [N]; 0 = greedy
    top_k: np.ndarray  # int32 [N]; 0 = off
    top_p: np.ndarray  # float32 [N]
    min_p: np.ndarray  # float32 [N]
    presence_penalty: np.ndarray  # float32 [N]
    frequency_penalty: np.ndarray  # float32 [N]
    repetition_penalty: np.ndarray  # float32 [N]
    seed: np.ndarray  # uint64 [N]: the request's seed mod 2**64 (0 where has_seed is False)
    has_seed: np.ndarray  # bool [N]
    token_index: np.ndarray  # int64 [N]: output tokens so far; a seeded draw depends on (seed, index) only
    num_logprobs: np.ndarray  # int32 [N]: -1 = no logprobs, k >= 0 = sampled token's plus top k
    # Penalized rows only (others own an empty range): their prompt + output token ids, CSR over rows;
    # the output part of row i starts at penalty_indptr[i] + prompt_len[i].
    penalty_indptr: np.ndarray  # int64 [N + 1]
    penalty_token_ids: np.ndarray  # int64 [total]
    prompt_len: np.ndarray  # int64 [N]
    bias_indptr: np.ndarray  # int64 [N + 1]: logit_bias, CSR over rows
    bias_token_ids: np.ndarray  # int64 [total]
    bias_values: np.ndarray  # float32 [total]; -inf where banned
    # int32 [N, words]: the tokens each row may sample (layout: engine/constraint.py); unconstrained rows
    # are all ones. None when no row has a grammar.
    token_bitmask: np.ndarray | None = None
    # Rows that verify a draft drawn from a real distribution q (engine/spec_sampling.py): their row
    # indexes (int64 [M], ascending), the drafts (int64 [M]) and q (float32 [M, draft vocab]). None when
    # no row has one (n-gram and greedy drafts: q one-hot, the plain draw is already the rule).
    spec_rows: np.ndarray | None = None
    spec_tokens: np.ndarray | None = None
    spec_probs: np.ndarray | None = None
    # Inputs whose arrays are shared read-only between steps (`decode_sampling_inputs`): what the three
    # properties below answer, worked out once (a sampler asks them every step: ~9 us of numpy, #34).
    derived: tuple[np.ndarray, bool, bool] | None = None

    @property
    def num_rows(self) -> int:
        return int(self.temperature.shape[0])

    @property
    def all_greedy(self) -> bool:
        if self.derived is not None:
            return self.derived[2]
        return not self.temperature.any()

    @property
    def penalized_rows(self) -> np.ndarray:
        """int64 row indexes whose penalties change anything."""
        if self.derived is not None:
            return self.derived[0]
        return np.flatnonzero(
            (self.presence_penalty != 0) | (self.frequency_penalty != 0) | (self.repetition_penalty != 1)
        )

    @property
    def wants_logprobs(self) -> bool:
        if self.derived is not None:
            return self.derived[1]
        return bool((self.num_logprobs >= 0).any())

    def take(self, rows: Sequence[int]) -> SamplingInputs:
        """The inputs of `rows` only, in that order (the runner drops embedding rows with it)."""
        index = np.asarray(rows, dtype=np.int64)
        spec_rows, spec_tokens, spec_probs = self._take_spec(index)
        penalty_indptr, penalty_ids = _take_csr(self.penalty_indptr, [self.penalty_token_ids], index)
        bias_indptr, bias_ids, bias_values = _take_csr(
            self.bias_indptr, [self.bias_token_ids, self.bias_values], index
        )
        return SamplingInputs(
            temperature=self.temperature[index],
            top_k=self.top_k[index],
            top_p=self.top_p[index],
            min_p=self.min_p[index],
            presence_penalty=self.presence_penalty[index],
            frequency_penalty=self.frequency_penalty[index],
            repetition_penalty=self.repetition_penalty[index],
            seed=self.seed[index],
            has_seed=self.has_seed[index],
            token_index=self.token_index[index],
            num_logprobs=self.num_logprobs[index],
            penalty_indptr=penalty_indptr,
            penalty_token_ids=penalty_ids,
            prompt_len=self.prompt_len[index],
            bias_indptr=bias_indptr,
            bias_token_ids=bias_ids,
            bias_values=bias_values,
            token_bitmask=None if self.token_bitmask is None else self.token_bitmask[index],
            spec_rows=spec_rows,
            spec_tokens=spec_tokens,
            spec_probs=spec_probs,
        )

    def _take_spec(self, index: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        if self.spec_rows is None or self.spec_tokens is None or self.spec_probs is None:
            return None, None, None
        where = {int(r): j for j, r in enumerate(self.spec_rows.tolist())}
        pairs = [(new, where[old]) for new, old in enumerate(index.tolist()) if old in where]
        if not pairs:
            return None, None, None
        picked = np.asarray([j for _, j in pairs], dtype=np.int64)
        return (
            np.asarray([new for new, _ in pairs], dtype=np.int64),
            self.spec_tokens[picked],
            self.spec_probs[picked],
        )

    def penalty_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For `rows` (positions 0..R-1 among them): (seen_row, seen_id) of every prompt + output token,
        and (out_row, out_id) of every output token (repeats count), all int64."""
        seen_row: list[np.ndarray] = []
        seen_id: list[np.ndarray] = []
        out_row: list[np.ndarray] = []
        out_id: list[np.ndarray] = []
        for j, i in enumerate(rows.tolist()):
            start, end = int(self.penalty_indptr[i]), int(self.penalty_indptr[i + 1])
            ids = self.penalty_token_ids[start:end]
            output = ids[int(self.prompt_len[i]) :]
            seen_row.append(np.full(len(ids), j, dtype=np.int64))
            seen_id.append(ids)
            out_row.append(np.full(len(output), j, dtype=np.int64))
            out_id.append(output)
        return _cat(seen_row), _cat(seen_id), _cat(out_row), _cat(out_id)

    def bias_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, token id, bias) of every logit_bias entry, as flat arrays."""
        rows = np.repeat(np.arange(self.num_rows, dtype=np.int64), np.diff(self.bias_indptr))
        return rows, self.bias_token_ids, self.bias_values

    def draw_seed(self, row: int) -> int:
        """The seed of row `row`'s draw this step: a pure function of (seed, token index), so a resumed
        request draws exactly what it would have drawn without the preemption."""
        return (int(self.seed[row]) * _SEED_STRIDE + int(self.token_index[row])) & _SEED_MASK


def build_sampling_inputs(
    rows: Sequence[tuple[SamplingParams, Sequence[int], int]],
    drafts: Sequence[tuple[int, int, np.ndarray]] = (),
) -> SamplingInputs:
    """One row per (params, prompt + output token ids, prompt length). O(rows + their penalty tokens +
    logit_bias entries) per step: nothing here is vocabulary-sized except `drafts`: (row, draft token,
    the draft's distribution q) of each row that verifies a sampled draft, rows ascending."""
    params = [p for p, _, _ in rows]
    n = len(params)
    # One array per kind of field, each field a row of it: fewer numpy calls a step (this runs once per
    # decode token; ~15 separate arrays cost ~45 µs of the engine thread on the real 1.5B model, #34).
    floats = np.array(
        [(p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
         for p in params],
        dtype=np.float32,
    ).reshape(n, 6).T.copy()  # fmt: skip
    ints = np.array([(p.top_k, -1 if p.logprobs is None else p.logprobs) for p in params], dtype=np.int32)
    ints = ints.reshape(n, 2).T.copy()
    penalty_chunks: list[Sequence[int]] = []
    penalty_lens: np.ndarray | None = None
    prompt_len = np.zeros(n, dtype=np.int64)
    bias_ids: list[int] = []
    bias_values: list[float] = []
    bias_lens: np.ndarray | None = None
    for i, (p, token_ids, num_prompt) in enumerate(rows):
        if p.needs_penalties:
            if penalty_lens is None:
                penalty_lens = np.zeros(n + 1, dtype=np.int64)
            penalty_chunks.append(token_ids)
            penalty_lens[i + 1] = len(token_ids)
            prompt_len[i] = num_prompt
        if p.logit_bias:
            if bias_lens is None:
                bias_lens = np.zeros(n + 1, dtype=np.int64)
            for token_id, bias in p.logit_bias.items():
                bias_ids.append(token_id)
                bias_values.append(bias if bias > BANNED_BIAS else -np.inf)
            bias_lens[i + 1] = len(p.logit_bias)
    penalty_ids = (
        np.concatenate([np.asarray(c, dtype=np.int64) for c in penalty_chunks])
        if penalty_chunks
        else np.zeros(0, dtype=np.int64)
    )
    return SamplingInputs(
        temperature=floats[0],
        top_k=ints[0],
        top_p=floats[1],
        min_p=floats[2],
        presence_penalty=floats[3],
        frequency_penalty=floats[4],
        repetition_penalty=floats[5],
        seed=np.array([(p.seed or 0) & _SEED_MASK for p in params], dtype=np.uint64).reshape(n),
        has_seed=np.array([p.seed is not None for p in params], dtype=bool).reshape(n),
        token_index=np.array([len(t) - k for _, t, k in rows], dtype=np.int64).reshape(n),
        num_logprobs=ints[1],
        penalty_indptr=np.zeros(n + 1, dtype=np.int64) if penalty_lens is None else np.cumsum(penalty_lens),
        penalty_token_ids=penalty_ids,
        prompt_len=prompt_len,
        bias_indptr=np.zeros(n + 1, dtype=np.int64) if bias_lens is None else np.cumsum(bias_lens),
        bias_token_ids=np.array(bias_ids, dtype=np.int64),
        bias_values=np.array(bias_values, dtype=np.float32),
        spec_rows=np.array([r for r, _, _ in drafts], dtype=np.int64) if drafts else None,
        spec_tokens=np.array([t for _, t, _ in drafts], dtype=np.int64) if drafts else None,
        spec_probs=np.stack([np.asarray(q, dtype=np.float32) for _, _, q in drafts]) if drafts else None,
    )


# Decode steps' sampling arrays by their rows' parameters (`decode_sampling_inputs`); cleared when full.
_SHARED: dict[tuple[tuple[object, ...], ...], SamplingInputs] = {}
_SHARED_MAX = 64


def decode_sampling_inputs(rows: Sequence[tuple[SamplingParams, Sequence[int], int]]) -> SamplingInputs:
    """`build_sampling_inputs(rows)` for a step without drafts. Where no row has penalties or a
    logit_bias, every array but `token_index` is a function of the rows' parameter values, so the arrays
    of the last steps with those values are handed out again, read-only (nothing writes them; a write
    would raise, not leak into a later step): a decode stream's rows do not change from token to token."""
    key = tuple(
        (p.temperature, p.top_k, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty,
         p.repetition_penalty, p.logprobs, p.seed)
        for p, _, _ in rows
        if not p.needs_penalties and not p.logit_bias
    )  # fmt: skip
    if len(key) != len(rows):
        return build_sampling_inputs(rows)
    token_index = np.array([len(t) - k for _, t, k in rows], dtype=np.int64)
    shared = _SHARED.get(key)
    if shared is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        shared = _SHARED[key] = build_sampling_inputs(rows)
        for name in shared.__slots__:
            if isinstance(array := getattr(shared, name), np.ndarray):
                array.flags.writeable = False
        penalized = shared.penalized_rows
        penalized.flags.writeable = False
        shared.derived = (penalized, shared.wants_logprobs, shared.all_greedy)
    return SamplingInputs(
        temperature=shared.temperature,
        top_k=shared.top_k,
        top_p=shared.top_p,
        min_p=shared.min_p,
        presence_penalty=shared.presence_penalty,
        frequency_penalty=shared.frequency_penalty,
        repetition_penalty=shared.repetition_penalty,
        seed=shared.seed,
        has_seed=shared.has_seed,
        token_index=token_index,
        num_logprobs=shared.num_logprobs,
        penalty_indptr=shared.penalty_indptr,
        penalty_token_ids=shared.penalty_token_ids,
        prompt_len=shared.prompt_len,
        bias_indptr=shared.bias_indptr,
        bias_token_ids=shared.bias_token_ids,
        bias_values=shared.bias_values,
        derived=shared.derived,
    )


def _take_csr(indptr: np.ndarray, data: list[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
    lens = np.diff(indptr)[rows]
    picked = [np.concatenate([d[indptr[r] : indptr[r + 1]] for r in rows.tolist()] or [d[:0]]) for d in data]
    return [np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), *picked]


def _cat(chunks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
