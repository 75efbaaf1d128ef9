"""Speculative decoding and prefix caching together on real hybrid layers through the MLX runner (CPU
device, float32, tiny random weights): the torch suite's agent waves
(tests/backends/test_hybrid_spec_prefix_torch.py) with MLX's verify rows and checkpoint copies."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.weights.bundle import ModelBundle  # noqa: E402
from tests.backends.test_hybrid_spec_mlx import mlx_runner  # noqa: E402
from tests.backends.test_hybrid_spec_prefix_torch import check_agent_waves  # noqa: E402
from tests.helpers.tiny_hybrids import BUILDERS  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module", params=list(BUILDERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def target(kind: str) -> ModelBundle:
    return bundle_from_hf(BUILDERS[kind]())


@pytest.mark.parametrize("method", ["ngram", "draft", "hybrid-draft"])
def test_agent_waves_speculating_under_preemption_equal_cold_runs(
    kind: str, target: ModelBundle, method: str
) -> None:
    check_agent_waves(kind, target, method, mlx_runner)
