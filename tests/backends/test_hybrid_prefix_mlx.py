"""Prefix caching for hybrid models on the MLX runner (CPU device, float32, tiny random weights): the
torch suite's checks (tests/backends/test_hybrid_prefix_torch.py) with the state checkpoints copied in
MLX's state arrays (backends/mlx/state_cache.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from tests.helpers.hybrid_prefix_checks import (  # noqa: E402
    check_nested_prefixes,
    check_next_turn_and_regenerate,
    check_preemption_and_eviction,
    check_shared_prefix,
)
from tests.helpers.parity import mlx_runner  # noqa: E402  (float32 on MLX's CPU device, seed 0)
from tests.helpers.tiny_hybrids import BUILDERS, runner_factory  # noqa: E402

pytestmark = pytest.mark.mlx


def runners(build: Callable[..., Any], **overrides: object) -> Callable[[], Any]:
    return runner_factory(mlx_runner, build, **overrides)


@pytest.mark.parametrize("family", BUILDERS)
def test_next_turn_and_regenerate_equal_a_cold_run(family: str) -> None:
    check_next_turn_and_regenerate(runners(BUILDERS[family]))


def test_preemption_and_eviction_equal_running_alone() -> None:
    check_preemption_and_eviction(runners(BUILDERS["qwen3_5"], num_key_value_heads=4, head_dim=64))


@pytest.mark.parametrize("family", BUILDERS)
def test_new_chats_sharing_a_prefix_restore_it_from_the_third_on(family: str) -> None:
    check_shared_prefix(runners(BUILDERS[family]))


@pytest.mark.parametrize("family", BUILDERS)
def test_nested_shared_prefixes_are_saved_where_the_cache_forks(family: str) -> None:
    check_nested_prefixes(runners(BUILDERS[family]))
