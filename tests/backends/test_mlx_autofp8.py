"""Issue #34 on MLX: an AutoFP8 folder (test_hf_autofp8.py's: e4m3 + a scalar float32 `weight_scale` per
linear, static `input_scale`, KV `output_scale` / `kv_scale`) loads with every layer linear as exact 8-bit
affine groups of 32 (the Q8_0 blocks hf_quant hands over, weights/hf_q8_blocks.py), follows the torch path
on the same Q8_0 values and keeps the exact fp8 run's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_hf_fp8_compact import Q8_ATOL  # noqa: E402
from tests.backends.test_mlx_fp8_moe_mla import SAME_VALUES_ATOL, affine_values, assert_q8, generate  # noqa: E402
from tests.helpers.autofp8 import COMPACT_SCHEMES, write_autofp8  # noqa: E402
from tests.helpers.parity import PROMPT, mlx_runner  # noqa: E402
from tests.helpers.q8_values import q8_values_runner  # noqa: E402
from tests.helpers.torch_models import fp32_runner  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.mark.parametrize("scheme", COMPACT_SCHEMES)
def test_autofp8_stays_8bit_on_mlx(tmp_path: Path, scheme: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_autofp8(tmp_path, scheme)
    runner = mlx_runner(load_model(tmp_path))
    stored = weights = 0
    for i, layer in enumerate(runner.model.layers):
        for param in ("qkv", "o", "gate_up", "down"):
            weight = getattr(layer, param)
            assert_q8(weight, f"{i}.{param}")
            stored += sum(a.nbytes for a in (weight.packed, weight.scales, weight.biases))
            weights += affine_values(weight).size
    got_logits, got_tokens = generate(runner, PROMPT)
    ref_logits, ref_tokens = generate(q8_values_runner(tmp_path), PROMPT)  # torch, on the Q8_0 values
    exact_logits, exact_tokens = generate(fp32_runner(load_model(tmp_path)), PROMPT)  # the fp8 values
    same, exact = np.abs(got_logits - ref_logits).max(), np.abs(got_logits - exact_logits).max()
    with capsys.disabled():
        print(
            f"\nAutoFP8 {scheme} on MLX: {8 * stored / weights:.1f} bits a weight (float32 scales); max |logit "
            f"diff| vs torch on the Q8_0 values {same:.1e}, vs the exact fp8 run {exact:.3f}"
        )
    assert got_tokens == ref_tokens == exact_tokens
    assert same < SAME_VALUES_ATOL
    assert exact < Q8_ATOL
    assert 8 * stored / weights == 10.0  # 8-bit codes + float32 scale and bias per 32 (fp32 compute)
