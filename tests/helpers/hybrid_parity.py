"""What the hybrid-model suites share (a recurrent state per request beside the paged K/V: Qwen3.5's gated
DeltaNet, Mamba-2 in Granite 4.0-H and Nemotron-H, LFM2's short convolutions), on the torch and the MLX
runner alike: a driver that gives each request a state slot, the prompt's logits in one step or in chunks
held to transformers', and ragged batched decode with a preemption held to transformers' greedy generate.
Each suite keeps its own tolerance (its kernels' float error differs) and passes it in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from localchat.engine.interface import BatchInputs, SchedulerOutput
from tests.helpers.parity import as_numpy
from tests.helpers.torch_batch import PagedDriver

REQ = "a"


class HybridDriver(PagedDriver):
    """PagedDriver plus the engine's part for hybrid models: a state slot per request."""

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self.slot_of: dict[str, int] = {}

    def build(
        self, schedule: dict[str, int] | None = None, *, every_token: bool = False
    ) -> tuple[SchedulerOutput, BatchInputs]:
        out, batch = super().build(schedule, every_token=every_token)
        for req_id in batch.req_ids:
            if req_id not in self.slot_of:
                self.slot_of[req_id] = min(set(range(4)) - set(self.slot_of.values()))
        batch.state_slots = np.array([self.slot_of[r] for r in batch.req_ids], dtype=np.int64)
        return out, batch

    def preempt(self, req_id: str) -> None:
        super().preempt(req_id)
        del self.slot_of[req_id]  # recompute: a fresh slot, rebuilt from the tokens


def reference_logits(hf: Any, tokens: list[int]) -> np.ndarray:
    """transformers' logits [len(tokens), vocab], float32."""
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float().numpy()


def assert_prefill_matches(
    hf: Any,
    runner: Any,
    prompt: list[int],
    chunks: Sequence[int] | None = None,
    *,
    tol: float,
    mean_tol: float | None = None,
) -> None:
    """Every prompt token's logits, in one step or in `chunks` (each continuing from the state the last one
    left), within `tol` of transformers' (and with `mean_tol`, within it on average)."""
    driver = HybridDriver(runner)
    driver.add(REQ, prompt)
    if chunks is None:
        _, logits = driver.step_logits(every_token=True)
        ours = as_numpy(logits)
    else:
        assert sum(chunks) == len(prompt)
        ours = np.concatenate([as_numpy(driver.step_logits({REQ: n}, every_token=True)[1]) for n in chunks])
    theirs = reference_logits(hf, prompt)
    assert ours.shape == theirs.shape
    err = np.abs(ours - theirs)
    assert err.max() < tol, err.max()
    if mean_tol is not None:
        assert err.mean() < mean_tol, err.mean()


def assert_decode_matches_generate(
    hf: Any, runner: Any, prompts: dict[str, list[int]], steps: int, preempt: tuple[str, int] | None = None
) -> None:
    """The requests decoded together for `steps` greedy steps (rows of different lengths in one batch) give
    transformers' generate for each alone; `preempt` (request, step): that request is preempted before the
    step and comes back as a prefill beside the others' decode rows."""
    expected = {}
    for req_id, prompt in prompts.items():
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False)
        expected[req_id] = out[0, len(prompt) :].tolist()
    driver = HybridDriver(runner)
    for req_id, prompt in prompts.items():
        driver.add(req_id, prompt)
    for step in range(steps):
        if preempt is not None and step == preempt[1]:
            driver.preempt(preempt[0])
        driver.step()
    for req_id, prompt in prompts.items():
        assert driver.tokens(req_id)[len(prompt) :] == expected[req_id], req_id
