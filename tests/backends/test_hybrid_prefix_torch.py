"""Prefix caching for hybrid models on the torch runner (float32, tiny random weights): the state
checkpoints (engine/state_checkpoints.py) copied in the runner's state tensors (backends/torch/
state_cache.py) give a chat's next turn and a regenerated answer the same greedy tokens and logprobs
(1e-4) as a cold run, also under preemption and eviction; Qwen3.5 (gated DeltaNet), Granite 4.0-H
(Mamba-2) and LFM2 (short conv)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers.hybrid_prefix_checks import (
    check_nested_prefixes,
    check_next_turn_and_regenerate,
    check_preemption_and_eviction,
    check_shared_prefix,
)
from tests.helpers.tiny_hybrids import BUILDERS, runner_factory
from tests.helpers.torch_models import fp32_runner


def runners(build: Callable[..., Any], **overrides: object) -> Callable[[], Any]:
    return runner_factory(fp32_runner, build, **overrides)


@pytest.mark.parametrize("family", BUILDERS)
def test_next_turn_and_regenerate_equal_a_cold_run(family: str) -> None:
    check_next_turn_and_regenerate(runners(BUILDERS[family]))


def test_preemption_and_eviction_equal_running_alone() -> None:
    # Wide K/V heads: 4 KiB per token, so a 1 MiB pool holds ~15 blocks and four chats preempt.
    check_preemption_and_eviction(runners(BUILDERS["qwen3_5"], num_key_value_heads=4, head_dim=64))


@pytest.mark.parametrize("family", BUILDERS)
def test_new_chats_sharing_a_prefix_restore_it_from_the_third_on(family: str) -> None:
    check_shared_prefix(runners(BUILDERS[family]))


@pytest.mark.parametrize("family", BUILDERS)
def test_nested_shared_prefixes_are_saved_where_the_cache_forks(family: str) -> None:
    check_nested_prefixes(runners(BUILDERS[family]))
