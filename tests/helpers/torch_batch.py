"""A stand-in for the engine in backend tests: allocates KV blocks (shuffled ids) and builds the
`SchedulerOutput` + `BatchInputs` of each step by hand, including chunked and prefix-shared prefills."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import (
    BatchInputs,
    CachedRequestData,
    NewRequestData,
    RunnerOutput,
    SchedulerOutput,
)
from localchat.engine.sampling_inputs import build_sampling_inputs
from localchat.engine.sampling_params import SamplingParams


@dataclass
class _Req:
    req_id: str
    tokens: list[int]  # prompt, then every token sampled so far
    prompt_len: int
    params: SamplingParams
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    sent: bool = False
    new_blocks: list[int] = field(default_factory=list)


class PagedDriver:
    def __init__(
        self,
        runner: TorchRunner,
        num_blocks: int = 96,
        block_size: int = 4,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        self.runner = runner
        self.block_size = block_size
        runner.initialize_kv_cache(num_blocks, block_size)
        self.free = list(range(num_blocks - 1, 0, -1))  # popped from the end: 1, 2, ...; 0 is the null block
        if shuffle:
            random.Random(seed).shuffle(self.free)  # non-contiguous, out-of-order block ids
        self.reqs: dict[str, _Req] = {}
        self._finished: set[str] = set()
        self._preempted: set[str] = set()

    def add(
        self,
        req_id: str,
        prompt: list[int],
        params: SamplingParams | None = None,
        *,
        share_prefix_with: str | None = None,
        num_cached: int = 0,
    ) -> None:
        """`share_prefix_with`: reuse that request's first `num_cached` tokens of KV (full blocks)."""
        req = _Req(req_id, list(prompt), len(prompt), params or SamplingParams(temperature=0.0))
        if share_prefix_with is not None:
            assert num_cached % self.block_size == 0
            req.block_ids = self.reqs[share_prefix_with].block_ids[: num_cached // self.block_size]
            req.num_computed = num_cached
        self.reqs[req_id] = req

    def tokens(self, req_id: str) -> list[int]:
        return self.reqs[req_id].tokens

    def feed(self, req_id: str, token: int) -> None:
        self.reqs[req_id].tokens.append(token)

    def finish(self, req_id: str) -> None:
        self.reqs.pop(req_id)
        self._finished.add(req_id)

    def preempt(self, req_id: str) -> None:
        """Recompute-style preemption: drop the KV; the request comes back as new next step."""
        req = self.reqs[req_id]
        req.block_ids, req.num_computed, req.sent = [], 0, False
        self._preempted.add(req_id)

    def step(self, schedule: dict[str, int] | None = None) -> RunnerOutput:
        out, batch = self.build(schedule)
        result = self.runner.execute_model(out, batch)
        for req_id, tokens in zip(result.req_ids, result.sampled_token_ids, strict=True):
            self.feed(req_id, tokens[0])
        return result

    def step_logits(
        self, schedule: dict[str, int] | None = None, *, every_token: bool = False
    ) -> tuple[list[str], torch.Tensor]:
        """Run a step and return (request id per logits row, logits); the caller feeds tokens back.
        `every_token`: a logits row for every scheduled token, not only each row's last."""
        out, batch = self.build(schedule, every_token=every_token)
        return batch.sample_req_ids, self.runner.compute_logits(out, batch)

    def build(
        self, schedule: dict[str, int] | None = None, *, every_token: bool = False
    ) -> tuple[SchedulerOutput, BatchInputs]:
        """`schedule`: req_id -> tokens to compute (default: all uncomputed tokens of every request)."""
        bs = self.block_size
        if schedule is None:
            schedule = {r: len(q.tokens) - q.num_computed for r, q in self.reqs.items()}
        ids, pos, slots, qsl, seq_lens, tables, logits_idx, sample_ids = [], [], [], [0], [], [], [], []
        new_reqs, cached_reqs = [], []
        for req_id, n in schedule.items():
            req = self.reqs[req_id]
            start, end = req.num_computed, req.num_computed + n
            assert n > 0 and end <= len(req.tokens)
            while len(req.block_ids) * bs < end:
                req.block_ids.append(self.free.pop())
                req.new_blocks.append(req.block_ids[-1])
            ids += req.tokens[start:end]
            pos += range(start, end)
            slots += [req.block_ids[p // bs] * bs + p % bs for p in range(start, end)]
            qsl.append(qsl[-1] + n)
            seq_lens.append(end)
            tables.append(req.block_ids)
            if every_token:
                logits_idx += range(qsl[-2], qsl[-1])
                sample_ids += [req_id] * n
            elif end == len(req.tokens):
                logits_idx.append(qsl[-1] - 1)
                sample_ids.append(req_id)
            if not req.sent:
                prompt, output = req.tokens[: req.prompt_len], req.tokens[req.prompt_len :]
                new_reqs.append(
                    NewRequestData(req_id, prompt, output, req.params, list(req.block_ids), req.num_computed)
                )
                req.sent = True
            else:
                cached_reqs.append(CachedRequestData(req_id, list(req.new_blocks), req.num_computed))
            req.new_blocks = []
            req.num_computed = end
        width = max(len(t) for t in tables)
        batch = BatchInputs(
            req_ids=list(schedule),
            input_ids=np.array(ids, dtype=np.int64),
            positions=np.array(pos, dtype=np.int64),
            slot_mapping=np.array(slots, dtype=np.int64),
            query_start_loc=np.array(qsl, dtype=np.int32),
            seq_lens=np.array(seq_lens, dtype=np.int32),
            block_tables=np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32),
            logits_indices=np.array(logits_idx, dtype=np.int64),
            sample_req_ids=sample_ids,
            max_query_len=max(schedule.values()),
            max_seq_len=max(seq_lens),
            block_size=bs,
            # Built as the engine builds it: each sampled row's params and tokens so far.
            sampling=build_sampling_inputs(
                [(self.reqs[r].params, self.reqs[r].tokens, self.reqs[r].prompt_len) for r in sample_ids]
            ),
        )
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=dict(schedule),
            total_num_scheduled_tokens=len(ids),
            finished_req_ids=self._finished,
            preempted_req_ids=self._preempted,
        )
        self._finished, self._preempted = set(), set()
        return out, batch
