"""Issue #34 on MLX: test_hf_fp8_deltanet.py's FP8 Qwen3.5 / Qwen3-Next folders (DeltaNet qkv / z / qkvz /
out in e4m3 128 x 128 tiles, b / a / ba in bf16) load with the whole DeltaNet in_proj and out as exact
8-bit affine groups of 32 of the Q8_0 blocks hf_quant hands over (before: dequantized), follow the torch
path on the same Q8_0 values and keep the exact fp8 run's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from localchat.weights.hf_q8_blocks import Q8Linear  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_hf_fp8_compact import _block_values  # noqa: E402
from tests.backends.test_hf_fp8_deltanet import Q8_DELTANET_ATOL, VARIANTS, generate, write_fp8_hybrid  # noqa: E402
from tests.backends.test_mlx_fp8_moe_mla import SAME_VALUES_ATOL, assert_q8  # noqa: E402
from tests.helpers.parity import mlx_runner  # noqa: E402
from tests.helpers.torch_models import fp32_runner  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_deltanet_stays_8bit_on_mlx(
    tmp_path: Path, variant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_fp8_hybrid(tmp_path, variant)
    runner = mlx_runner(load_model(tmp_path))
    linear_layers = [(i, layer) for i, layer in enumerate(runner.model.layers) if layer.linear]
    assert linear_layers
    for i, layer in linear_layers:
        assert_q8(layer.in_proj, f"{i}.in_proj")  # one matrix: its four parts agree in format
        assert_q8(layer.out, f"{i}.out")
    got_logits, got_tokens = generate(runner)
    with monkeypatch.context() as patch:
        patch.setattr(Q8Linear, "dequantize", _block_values)  # torch, dense, on the Q8_0 blocks' values
        ref_logits, ref_tokens = generate(fp32_runner(load_model(tmp_path)))
    exact_logits, exact_tokens = generate(fp32_runner(load_model(tmp_path)))
    same, exact = np.abs(got_logits - ref_logits).max(), np.abs(got_logits - exact_logits).max()
    with capsys.disabled():
        print(
            f"\nFP8 {variant} on MLX: vs torch on the Q8_0 values {same:.1e}, vs the exact fp8 run {exact:.3f}"
        )
    assert got_tokens == ref_tokens == exact_tokens
    assert same < SAME_VALUES_ATOL
    assert exact < Q8_DELTANET_ATOL
