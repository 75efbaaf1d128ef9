"""Single-token steps read cos/sin from per-chunk tables (layers.Rotary._one): bit for bit what the
one-row computation gives, at every position of a chunk and across chunk edges."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from localchat.backends.torch.layers import ROPE_CHUNK, ROPE_CHUNKS_KEPT, Rotary
from localchat.weights.config import ModelConfig

CPU = torch.device("cpu")


def _config(head_dim: int, **extra: Any) -> ModelConfig:
    return ModelConfig(
        model_type="llama", vocab_size=32, hidden_size=head_dim * 2, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
        rope_theta=1_000_000.0, **extra,
    )  # fmt: skip


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
CONFIGS = [
    _config(128),  # Qwen2.5-1.5B's heads
    _config(64),  # SmolLM2's
    _config(80),  # a width that is no multiple of the vector size
    _config(128, partial_rotary_factor=0.5),
    _config(128, rope_scaling=YARN, max_position_embeddings=16384),  # cos/sin scaled
]


@pytest.mark.parametrize("config", CONFIGS, ids=["128", "64", "80", "partial", "yarn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_single_positions_equal_the_one_row_computation(config: ModelConfig, dtype: torch.dtype) -> None:
    rotary = Rotary(config, CPU)
    positions = [*range(0, 3 * ROPE_CHUNK + 5), 4095, 4096, 20_000, 5, 131_071]
    for position in positions:
        cos, sin = rotary(torch.tensor([position]), dtype)
        want_cos, want_sin = rotary._tables(torch.tensor([position]), dtype)
        assert cos.shape == want_cos.shape and cos.is_contiguous() and cos.dtype == dtype
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), position
    assert len(rotary._chunks) <= ROPE_CHUNKS_KEPT


def test_several_rows_are_computed_as_before() -> None:
    rotary = Rotary(CONFIGS[0], CPU)
    positions = torch.tensor([3, 70, 9])
    cos, sin = rotary(positions, torch.bfloat16)
    for i, p in enumerate(positions.tolist()):
        one_cos, one_sin = rotary(torch.tensor([p]), torch.bfloat16)
        assert torch.equal(cos[i : i + 1], one_cos) and torch.equal(sin[i : i + 1], one_sin)


def test_a_new_frequency_table_drops_the_cached_chunks() -> None:
    scaling = {
        "rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [4.0] * 32,
        "original_max_position_embeddings": 4096,
    }  # fmt: skip
    rotary = Rotary(_config(64, rope_scaling=scaling, max_position_embeddings=131072), CPU)
    before, _ = rotary(torch.tensor([100]), torch.float32)
    rotary.serve_context(131072)  # past the original length: the long factors
    after, _ = rotary(torch.tensor([100]), torch.float32)
    assert not torch.equal(before, after)
    assert torch.equal(after, rotary._tables(torch.tensor([100]), torch.float32)[0])
