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
"""

from __future__ import annotations

from collections import deque
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
        try:
            runner_output = self.runner.finish_step()
        except Exception as exc:  # a failed step must not take the engine down
            return failed + self.engine.fail_step(scheduler_output, exc)
        return failed + self.engine.apply_output(scheduler_output, runner_output)

    def _submit(self) -> tuple[bool, list[RequestOutput]]:
        """Schedule and start the next group's step; (whether one started, failed requests' outputs)."""
        engine, scheduler = self.engine, self.engine.scheduler
        # Groups of about equal size: 1/depth of the requests that may run now, each step.
        wanted = min(len(scheduler.running) + len(scheduler.waiting), engine.config.max_num_seqs)
        scheduler.max_step_seqs = max(1, -(-wanted // self.depth))
        scheduler_output = scheduler.schedule()
        if scheduler_output.is_empty:
            return False, []
        try:
            batch = engine.build_batch(scheduler_output)
            self.runner.submit_step(scheduler_output, batch)
        except Exception as exc:
            return False, engine.fail_step(scheduler_output, exc)
        scheduler.in_flight.update(scheduler_output.num_scheduled_tokens)
        self.steps.append((scheduler_output, batch))
        return True, []
