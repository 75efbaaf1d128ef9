"""Prefix caching for hybrid models on the MLX runner (CPU device, float32, tiny random weights): the
torch suite's checks (tests/backends/test_hybrid_prefix_torch.py) with the state checkpoints copied in
MLX's state arrays (backends/mlx/state_cache.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends import RunnerOptions  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_granitemoehybrid import tiny_granite  # noqa: E402
from tests.backends.test_lfm2 import tiny_lfm2  # noqa: E402
from tests.backends.test_qwen3_next import tiny_qwen3_5  # noqa: E402
from tests.helpers.hybrid_prefix_checks import (  # noqa: E402
    check_next_turn_and_regenerate,
    check_preemption_and_eviction,
)
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx

BUILDERS: dict[str, Callable[..., Any]] = {
    "qwen3_5": tiny_qwen3_5,
    "granite": tiny_granite,
    "lfm2": tiny_lfm2,
}


def runners(build: Callable[..., Any], **overrides: object) -> Callable[[], Any]:
    bundle = bundle_from_hf(build(**overrides))
    return lambda: MLXRunner(bundle, RunnerOptions(device="cpu", dtype="float32", seed=0))


@pytest.mark.parametrize("family", BUILDERS)
def test_next_turn_and_regenerate_equal_a_cold_run(family: str) -> None:
    check_next_turn_and_regenerate(runners(BUILDERS[family]))


def test_preemption_and_eviction_equal_running_alone() -> None:
    check_preemption_and_eviction(runners(tiny_qwen3_5, num_key_value_heads=4, head_dim=64))
