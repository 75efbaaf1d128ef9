"""Several decode steps in flight under `--pp` (engine/in_flight.py, parallel/in_flight.py): the running
requests are served in groups, one step per stage in flight, and a group's next step is scheduled only
once its tokens are back. Greedy tokens equal the one-step-at-a-time engine on one device for ragged
prompts with chunked prefills, requests that finish mid-batch, preemption (a small KV pool), an abort
while the request's step is in flight, and a hybrid model (state slots on each stage): first with a
runner that hands each output back one step late (the engine's side alone, fast), then over gloo PP=2
(two processes)."""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import replace
from typing import Any, cast

import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.backends import test_pipeline_hybrid as hybrid
from tests.backends import test_pipeline_parallel as plain
from tests.helpers.torch_models import exact_weights

LENGTHS = (400, 5, 450, 60, 420, 390)
MAX_TOKENS = (40, 9, 60, 30, 50, 45)  # they finish at different steps, mid-batch
ABORT_AT = 30  # engine steps (then past every prefill, with steps in flight)


def prompts() -> list[list[int]]:
    return [[(7 * i + 3 * j) % 250 + 3 for j in range(n)] for i, n in enumerate(LENGTHS)]


def config(kv_cache_mib: int | None) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=6, max_num_batched_tokens=256, prefill_chunk_size=64, kv_cache_mib=kv_cache_mib
    )


class OneStepLate:
    """A runner that runs each submitted step at once but hands its output back only when asked
    (`finish_step`), as a pipeline's last stage does: the engine's side of steps in flight."""

    def __init__(self, runner: TorchRunner, depth: int) -> None:
        self.runner = runner
        self.steps_in_flight = depth
        self.outputs: deque[RunnerOutput] = deque()
        self.most_in_flight = 0
        self.step_sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def submit_step(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> None:
        self.outputs.append(self.runner.execute_model(scheduler_output, batch))
        self.most_in_flight = max(self.most_in_flight, len(self.outputs))
        self.step_sizes.append(len(batch.req_ids))

    def finish_step(self) -> RunnerOutput:
        return self.outputs.popleft()


def serve(engine: LLMEngine, abort: bool = False) -> tuple[list[list[int]], int]:
    """Every prompt's greedy tokens, and which one was aborted: with `abort`, at step ABORT_AT, the
    request with the most tokens to go among those whose step is in flight (any, on one device)."""
    ids = [
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True))
        for p, m in zip(prompts(), MAX_TOKENS, strict=True)
    ]
    out: dict[str, list[int]] = {i: [] for i in ids}
    steps, aborted = 0, -1
    while engine.has_unfinished:
        for o in engine.step():
            assert o.error is None, o.error
            out[o.req_id] += o.new_token_ids
        steps += 1
        if abort and steps == ABORT_AT:
            busy = engine.scheduler.in_flight if engine.in_flight is not None else set(ids)
            assert busy
            aborted = max(
                (i for i, r in enumerate(ids) if r in busy), key=lambda i: MAX_TOKENS[i] - len(out[ids[i]])
            )
            assert engine.abort_request(ids[aborted]) is not None
    return [out[i] for i in ids], aborted


def reference(bundle: ModelBundle, kv_cache_mib: int | None) -> tuple[list[list[int]], int]:
    with exact_weights():
        runner = TorchRunner(bundle, plain.EXACT)
    engine = LLMEngine(runner, FakeTokenizer(), config(kv_cache_mib), eos_token_ids=[2], model_max_len=1024)
    return serve(engine)[0], engine.scheduler.num_preemptions


def check_aborted(got: list[list[int]], want: list[list[int]], aborted: int) -> None:
    """The others' tokens are the reference's; the aborted one's a prefix of it."""
    assert [t for i, t in enumerate(got) if i != aborted] == [t for i, t in enumerate(want) if i != aborted]
    short = got[aborted]
    assert 0 < len(short) < len(want[aborted]) and short == want[aborted][: len(short)]


def test_the_scheduler_skips_and_never_preempts_a_request_in_flight() -> None:
    from tests.unit.test_scheduler import complete_step, make, req

    s = make(num_blocks=7, max_num_batched_tokens=100)  # 6 usable blocks of 4 tokens
    for name, base in (("a", 0), ("b", 100), ("c", 200)):
        s.add_request(req(name, 8, base=base, max_tokens=20))
    out = s.schedule()
    complete_step(s, out)
    assert s.block_manager.num_free_blocks == 0
    s.in_flight = {"c"}  # the newest: the victim were it not in flight
    out = s.schedule()  # a needs a 3rd block
    assert out.preempted_req_ids == {"b"} and out.num_scheduled_tokens == {"a": 1}
    s.in_flight, s.max_step_seqs = set(), 1
    assert s.schedule().num_scheduled_tokens == {"a": 1}  # at most one request per step


@pytest.mark.parametrize("kv_cache_mib", [None, 1], ids=["roomy", "preempting"])
def test_one_step_late_outputs_give_the_same_tokens(kv_cache_mib: int | None) -> None:
    torch.set_num_threads(1)
    bundle = plain.family_bundle("llama")
    want, preemptions = reference(bundle, kv_cache_mib)
    assert (preemptions > 0) == (kv_cache_mib == 1)
    for abort in (False, True):
        with exact_weights():
            runner = OneStepLate(TorchRunner(bundle, plain.EXACT), depth=2)
        engine = LLMEngine(
            cast(Any, runner), FakeTokenizer(), config(kv_cache_mib), eos_token_ids=[2], model_max_len=1024
        )
        assert engine.in_flight is not None
        got, aborted = serve(engine, abort)
        assert runner.most_in_flight == 2
        assert max(runner.step_sizes) <= 3  # a group is half the requests
        if abort:
            check_aborted(got, want, aborted)
        else:
            assert got == want
            assert (engine.scheduler.num_preemptions > 0) == (kv_cache_mib == 1)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
        assert not engine.scheduler.in_flight


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp2_steps_in_flight_match_one_device() -> None:
    """PP=2 over gloo: rank 0 runs group B's step on stage 0 while rank 1 runs group A's; the same
    tokens as one device, roomy and preempting, with an abort in flight; then a hybrid model."""
    torch.set_num_threads(1)
    bundle = plain.family_bundle("llama")
    with exact_weights():
        ranks = ParallelRunner(bundle, plain.PP2, load=functools.partial(plain.family_bundle, "llama"))
    try:
        assert ranks.steps_in_flight == 2
        for kv_cache_mib in (None, 1):
            want, _ = reference(bundle, kv_cache_mib)
            for abort in (False, True):
                engine = LLMEngine(
                    cast(Any, ranks),
                    FakeTokenizer(),
                    config(kv_cache_mib),
                    eos_token_ids=[2],
                    model_max_len=1024,
                )
                got, aborted = serve(engine, abort)
                if abort:
                    check_aborted(got, want, aborted)
                else:
                    assert got == want
                    assert (engine.scheduler.num_preemptions > 0) == (kv_cache_mib == 1)
    finally:
        ranks.shutdown()


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp2_steps_in_flight_of_a_hybrid_match_one_device() -> None:
    """Qwen3.5 ([DeltaNet x3, attention]: stage 0 keeps state slots only): the slots of both groups
    are taken, zeroed and freed on each stage in step order."""
    torch.set_num_threads(1)
    bundle = hybrid.hybrid_bundle("qwen3_5")
    want, _ = reference(bundle, None)
    with exact_weights():
        ranks = ParallelRunner(bundle, plain.PP2, load=functools.partial(hybrid.hybrid_bundle, "qwen3_5"))
    try:
        engine = LLMEngine(
            cast(Any, ranks), FakeTokenizer(), config(None), eos_token_ids=[2], model_max_len=1024
        )
        assert engine.state_pool is not None and engine.in_flight is not None
        assert serve(engine)[0] == want
    finally:
        ranks.shutdown()


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp3_keeps_three_steps_in_flight() -> None:
    """PP=3: three groups, one per stage; the middle rank receives one group's hidden states and
    sends them on while its neighbours work on the other two. An abort in flight too."""
    torch.set_num_threads(1)
    bundle = plain.family_bundle("llama")
    want, _ = reference(bundle, None)
    options = replace(plain.PP2, pipeline_parallel_size=3)
    with exact_weights():
        ranks = ParallelRunner(bundle, options, load=functools.partial(plain.family_bundle, "llama"))
    try:
        engine = LLMEngine(
            cast(Any, ranks), FakeTokenizer(), config(None), eos_token_ids=[2], model_max_len=1024
        )
        assert engine.in_flight is not None and engine.in_flight.depth == 3
        got, aborted = serve(engine, abort=True)
        check_aborted(got, want, aborted)
    finally:
        ranks.shutdown()
