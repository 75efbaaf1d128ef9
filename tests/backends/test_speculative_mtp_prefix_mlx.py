"""`--speculative mtp` on the MLX runner under prefix caching and preemption: the agent waves of
test_hybrid_spec_prefix_torch.py in a 1 MiB pool, on the tiny Qwen3.5 bigram target with an MTP head that
agrees with it but for noise (test_speculative_mtp_prefix.py's), equal cold MLX runs token for token.
Prefix-cache hits leave positions the head never saw, preempted sequences come back recomputed: the
head's rows for them are replaced, and the output stays exact. The check itself is
test_speculative_mtp_prefix.py's, run through the MLX runner and head."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("torch")

from localchat.backends.mlx.mtp_proposer import attach_mtp
from tests.backends.test_speculative_mtp_prefix import check_agent_waves
from tests.helpers.parity import mlx_runner

pytestmark = pytest.mark.mlx


def test_agent_waves_with_an_mtp_head_under_preemption_equal_cold_runs() -> None:
    check_agent_waves(mlx_runner, attach_mtp)
