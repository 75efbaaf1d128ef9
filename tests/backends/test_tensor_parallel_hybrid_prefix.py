"""Hybrid prefix caching under tensor parallelism (TP=2, gloo, 2 processes on CPU): every rank applies
the step's state copies (`BatchInputs.state_copies`: checkpoint saves and restores) to its own share of
the state slots, so a chat's next turn, a regenerated answer and a third chat sharing a system prompt
restore checkpoints and give one device's cold-run greedy tokens and logprobs (1e-4), and the restore
is held to account (skipped, the logprobs move). One TP=2 runner serves every engine in turn."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.weights.bundle import ModelBundle
from tests.backends.test_pipeline_hybrid import hybrid_bundle
from tests.backends.test_tensor_parallel_hybrid import granite_bundle
from tests.helpers.hybrid_prefix_checks import check_next_turn_and_regenerate, check_shared_prefix
from tests.helpers.torch_models import exact_weights, fp32_runner
from tests.helpers.tp_parity import TP2

# Seeded loaders the workers run too. (Not Nemotron-H: its one-step Mamba-2 update does not clamp dt
# as its scan does, as in transformers, so a next turn restored from a decode checkpoint differs from a
# cold run's prefill of the same reply, by 0.014 in a logprob on one device already.)
LOADERS: dict[str, Callable[[], ModelBundle]] = {
    "qwen3_5": functools.partial(hybrid_bundle, "qwen3_5"),
    "granite": granite_bundle,
}


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("kind", LOADERS)
def test_tp2_restores_checkpoints_like_a_cold_run_on_one_device(kind: str) -> None:
    torch.set_num_threads(1)
    load = LOADERS[kind]
    with exact_weights():
        sharded: Any = ParallelRunner(load(), TP2, load=load)
    try:
        spec, whole = sharded.state_cache_spec, fp32_runner(load()).state_cache_spec
        assert spec is not None and whole is not None and spec.bytes_per_slot * 2 == whole.bytes_per_slot
        check_next_turn_and_regenerate(lambda: sharded, cold_runner=fp32_runner(load()))
        check_shared_prefix(lambda: sharded, cold_runner=fp32_runner(load()))
    finally:
        sharded.shutdown()
