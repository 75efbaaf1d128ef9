"""Speculative decoding on hybrid models through the MLX runner (CPU device, float32, tiny random
weights): the torch suite's checks (tests/backends/test_hybrid_spec_torch.py) with the verify rows'
per-position states written by MLX's layers (backends/mlx/state_cache.py `StepRows.verify`)."""

from __future__ import annotations

from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.weights.bundle import ModelBundle  # noqa: E402
from tests.backends.test_hybrid_spec_torch import (  # noqa: E402
    assert_same,
    check_draft_rejected_part_way,
    engine,
    run,
)
from tests.helpers.parity import mlx_runner  # noqa: E402  (float32 on MLX's CPU device, seed 0)
from tests.helpers.tiny_hybrids import BUILDERS  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module", params=list(BUILDERS))
def target(request: pytest.FixtureRequest) -> ModelBundle:
    return bundle_from_hf(BUILDERS[request.param]())


@pytest.fixture(scope="module")
def plain(target: ModelBundle) -> list[tuple[list[int], list[float]]]:
    return run(engine(target, "off", make_runner=mlx_runner))


def test_ngram_output_equals_plain_decoding(target: ModelBundle, plain: Any) -> None:
    eng = engine(target, "ngram", make_runner=mlx_runner)
    assert eng.speculation_note == "" and eng.scheduler.spec_rows is not None
    assert_same(run(eng), plain)
    assert eng.spec_draft_tokens > 0 and eng.scheduler.spec_rows.fixups_total > 0


def test_draft_model_rejected_part_way_equals_plain_decoding(target: ModelBundle, plain: Any) -> None:
    check_draft_rejected_part_way(target, plain, mlx_runner)
