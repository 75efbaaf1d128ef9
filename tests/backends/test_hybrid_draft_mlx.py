"""A hybrid draft model through the MLX runner (CPU device, float32, tiny random weights): the torch
suite's checks (tests/backends/test_hybrid_draft_torch.py), with the draft's state snapshots and copies
applied by the MLX state cache."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.weights.bundle import ModelBundle  # noqa: E402
from tests.backends.test_hybrid_draft_torch import (  # noqa: E402
    check_hybrid_draft,
    check_plain_target,
    perturbed,
    wrong_proposals,
)
from tests.backends.test_hybrid_spec_mlx import mlx_runner  # noqa: E402
from tests.helpers.tiny_hybrids import BUILDERS  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module", params=list(BUILDERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def draft(kind: str) -> ModelBundle:
    return perturbed(BUILDERS[kind])


def test_hybrid_draft_for_a_hybrid_target_is_exact(kind: str, draft: ModelBundle) -> None:
    target = bundle_from_hf(BUILDERS[kind]())
    _, _, proposals = check_hybrid_draft(target, draft, mlx_runner)
    assert wrong_proposals(draft, proposals, mlx_runner) == 0


def test_hybrid_draft_for_a_plain_transformer_target(draft: ModelBundle) -> None:
    check_plain_target(draft, mlx_runner)
