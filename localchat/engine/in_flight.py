"""Several engine steps in flight, for runners that pipeline them (`--pp N`: one step per stage).

The running requests are served in groups: a step takes at most 1/depth of them (the scheduler skips
requests whose step is not back yet), is submitted to the runner without waiting, and the next group's
step is scheduled and submitted while the first is still in a later stage. A request's next step is
scheduled only once its previous step's tokens are back, so every step sees exactly the tokens a
one-step-at-a-time engine would give it (greedy output is the same). Each `step()` call fills the
pipeline, then waits for the oldest step and returns its outputs.

Blocks and state slots of a request that ends (abort) while its step is in flight are freed at once:
a later step that reuses them runs after the in-flight one on every stage (each stage takes steps in
order), so the old step's writes land first. In-flight requests are never preempted.

A failed step's blocks are unnamed (`forget_unwritten`), but a later step already in flight may have
been scheduled to read them: a request admitted there with them as prefix hits (or as a partial copy's
source). Its K/V from that step are then computed over garbage, and so is what it wrote: its blocks
named there are unnamed at once too (a step scheduled after the failure cannot hit them), and further
steps in flight are checked against those as well (the cascade). Such a request is recomputed, not
failed: when its step comes back, its rows are dropped and it is preempted (its blocks freed, back to
the front of the queue with its tokens), so its answer is a cold run's and nothing is lost.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from localchat.engine.engine import LLMEngine
    from localchat.engine.outputs import RequestOutput


class PipelinedRunner(Protocol):
    def submit_step(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> None: ...

    def finish_step(self) -> RunnerOutput: ...


class StepsInFlight:
    def __init__(self, engine: LLMEngine, depth: int) -> None:
        self.engine = engine
        self.depth = depth
        self.runner: PipelinedRunner = engine.runner  # type: ignore[assignment]
        self.steps: deque[tuple[SchedulerOutput, BatchInputs]] = deque()
        # Requests in a step in flight that read what a failed step never wrote: recomputed once that
        # step is back (`_cascade`); then the runner must forget them before their next step.
        self.redo: set[str] = set()
        self.forget: set[str] = set()

    @property
    def busy(self) -> bool:
        return bool(self.steps)

    def step(self) -> list[RequestOutput]:
        failed: list[RequestOutput] = []
        while len(self.steps) < self.depth:
            submitted, outputs = self._submit()
            failed += outputs
            if not submitted:
                break
        if not self.steps:
            return failed
        scheduler_output, _batch = self.steps.popleft()
        self.engine.scheduler.in_flight.difference_update(scheduler_output.num_scheduled_tokens)
        redo = self.redo.intersection(scheduler_output.num_scheduled_tokens)
        self.redo -= redo
        kept = _without(scheduler_output, redo)
        try:
            runner_output = self.runner.finish_step()
        except Exception as exc:  # a failed step must not take the engine down
            block_manager = self.engine.block_manager
            step = scheduler_output.block_step
            unwritten = {b.block_id for b in block_manager.blocks if b.named_in_step == step}
            failed += self.engine.fail_step(kept, exc)
            # Blocks of requests aborted while the step was in flight are named still.
            block_manager.unname({b for b in unwritten if block_manager.blocks[b].token_ids is not None})
            self._cascade(unwritten)
            self._recompute(redo)
            return failed
        self._recompute(redo)
        return failed + self.engine.apply_output(kept, _rows_without(runner_output, redo))

    def _cascade(self, unwritten: set[int]) -> None:
        """Mark the requests of later steps in flight that read `unwritten` blocks (hits or a partial
        copy's source), in step order, and unname what those steps named for them: later steps that hit
        those are caught in turn, and so is a twin admitted beside one in the same step."""
        block_manager, requests = self.engine.block_manager, self.engine.scheduler.requests
        for scheduler_output, _batch in self.steps:
            step = scheduler_output.block_step
            copied = {dst for src, dst, _ in scheduler_output.kv_copies if src in unwritten}
            found = True
            while found:
                found = False
                for req_id in scheduler_output.num_scheduled_tokens:
                    request = requests.get(req_id)
                    if request is None or req_id in self.redo:
                        continue
                    if not any(b in unwritten or b in copied for b in request.block_ids):
                        continue
                    found = True
                    self.redo.add(req_id)
                    mine = {b for b in request.block_ids if block_manager.blocks[b].named_in_step == step}
                    unwritten |= mine
                    # Its names from the first untrusted block on go (free() would name them again).
                    registered = request.block_ids[: request.num_registered_blocks]
                    first = next(
                        (i for i, b in enumerate(registered) if b in unwritten or b in copied),
                        len(registered),
                    )
                    request.num_registered_blocks = first
                    del request.block_hashes[first:]
                    block_manager.unname(mine)

    def _recompute(self, req_ids: set[str]) -> None:
        """Preempt these requests (their step is back, its rows dropped): they start again from their
        tokens, through the prefix cache's trusted blocks."""
        scheduler = self.engine.scheduler
        for req_id in req_ids:
            request = scheduler.requests.get(req_id)
            if request is None:
                continue  # aborted meanwhile
            scheduler.running.remove(request)
            request.num_computed_tokens = 0  # before freeing: no kept tail of untrusted K/V
            scheduler._preempt(request)
            self.forget.add(req_id)

    def _submit(self) -> tuple[bool, list[RequestOutput]]:
        """Schedule and start the next group's step; (whether one started, failed requests' outputs)."""
        engine, scheduler = self.engine, self.engine.scheduler
        # Groups of about equal size: 1/depth of the requests that may run now, each step.
        wanted = min(len(scheduler.running) + len(scheduler.waiting), engine.config.max_num_seqs)
        scheduler.max_step_seqs = max(1, -(-wanted // self.depth))
        scheduler_output = scheduler.schedule()
        if scheduler_output.is_empty:
            return False, []
        scheduler_output.preempted_req_ids |= self.forget  # recomputed (_recompute): forgotten first
        self.forget = set()
        try:
            batch = engine.build_batch(scheduler_output)
            self.runner.submit_step(scheduler_output, batch)
        except Exception as exc:
            return False, engine.fail_step(scheduler_output, exc)
        scheduler.in_flight.update(scheduler_output.num_scheduled_tokens)
        self.steps.append((scheduler_output, batch))
        return True, []


def _without(scheduler_output: SchedulerOutput, req_ids: set[str]) -> SchedulerOutput:
    """The step as the engine takes it back, less the requests being recomputed."""
    if not req_ids:
        return scheduler_output
    scheduled = {r: n for r, n in scheduler_output.num_scheduled_tokens.items() if r not in req_ids}
    return replace(
        scheduler_output, num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values())
    )


def _rows_without(output: RunnerOutput, req_ids: set[str]) -> RunnerOutput:
    """The runner's rows less those of the requests being recomputed (a speculative one has several)."""
    if not req_ids:
        return output
    rows = [i for i, r in enumerate(output.req_ids) if r not in req_ids]
    logprobs = output.logprobs
    return RunnerOutput(
        [output.req_ids[i] for i in rows],
        [output.sampled_token_ids[i] for i in rows],
        None if logprobs is None else [logprobs[i] for i in rows],
        {r: e for r, e in output.embeddings.items() if r not in req_ids} if output.embeddings else None,
    )
