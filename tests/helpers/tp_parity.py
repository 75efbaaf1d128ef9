"""What every tensor-parallel parity test shares: a ParallelRunner (TP, or TP x PP) built from a seeded
loader gives one device's greedy tokens and float32 logits within 1e-4 (the all-reduce sums the ranks'
parts in another order), for a ragged batched prefill then decode, and for a chunked prefill with a
preemption. Models with a recurrent state (DeltaNet, Mamba-2, short convolutions) run the hybrid
scenario instead (state slots, a 70-token prompt that spans two scan chunks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.bundle import ModelBundle
from tests.helpers.torch_models import exact_weights, fp32_runner

TP2 = RunnerOptions(device="cpu", dtype="float32", num_threads=1, tensor_parallel_size=2)
TP2_PP2 = replace(TP2, pipeline_parallel_size=2)
TOLERANCE = 1e-4

Scenario = Callable[[TorchRunner], Any]


def _scenarios(reference: TorchRunner) -> tuple[Scenario, Scenario]:
    """(ragged_then_decode, chunked_and_preempted) for this model: the hybrid ones when it keeps state."""
    if reference.state_cache_spec is not None:
        from tests.backends import test_pipeline_hybrid as hybrid

        return hybrid.ragged_then_decode, hybrid.chunked_and_preempted
    from tests.backends import test_pipeline_parallel as dense

    return dense.ragged_then_decode, dense.chunked_and_preempted


def assert_tp_parity(
    load: Callable[[], ModelBundle],
    options: RunnerOptions = TP2,
    check: Callable[[Any], None] | None = None,
) -> None:
    """`load` is also the workers' loader (a picklable, seeded function: every rank builds the same
    weights); `check` gets rank 0's own runner (its `model`, and under --pp its `plan`) to assert the
    slice it holds. The runner is shut down whatever fails."""
    torch.set_num_threads(1)
    reference = fp32_runner(load())
    ragged, chunked = _scenarios(reference)
    want_logits, want_tokens = ragged(reference)
    want_chunked = chunked(reference)
    with exact_weights():
        runner = ParallelRunner(load(), options, load=load)
    try:
        if check is not None:
            check(runner.runner)
        sharded = cast(TorchRunner, runner)
        logits, tokens = ragged(sharded)
        assert tokens == want_tokens
        assert len(logits) == len(want_logits)
        for ours, ref in zip(logits, want_logits, strict=True):
            torch.testing.assert_close(ours, ref, rtol=TOLERANCE, atol=TOLERANCE)
        assert chunked(sharded) == want_chunked
    finally:
        runner.shutdown()
