"""Issue #34: the pre-load RAM check sizes a quantized folder as MLX holds it. MLX keeps FP8 / int8 (and
int4) linears as its own 8-bit (4-bit) groups with a scale and a bias per 32 values in the compute dtype,
whether or not localchat's torch CPU kernels are built (before, the estimate asked the kernels: without
them, or at float32 on a CPU without a fast many-row path, it sized the linears dequantized, at 2 or 4
bytes a value instead of 9 or 10 bits)."""

from __future__ import annotations

from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")

from localchat.backends.mlx.quant import QuantizedWeight  # noqa: E402
from localchat.models import memory  # noqa: E402
from localchat.weights.hf_quant import loaded_weight_bytes  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from localchat.weights.safetensors import safetensors_files  # noqa: E402
from tests.backends.test_hf_fp8_compact import CASES, write_folder  # noqa: E402
from tests.helpers.parity import mlx_runner  # noqa: E402

pytestmark = pytest.mark.mlx
LINEARS = ("qkv", "o", "gate_up", "down")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_estimate_sizes_fp8_linears_as_mlx_holds_them(
    tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_folder(tmp_path, *CASES["fp8-block128"])
    runner = mlx_runner(load_model(tmp_path), dtype)
    held = 0
    for layer in runner.model.layers:
        for name in LINEARS:
            weight = getattr(layer, name)
            assert isinstance(weight, QuantizedWeight) and weight.bits == 8
            held += sum(a.nbytes for a in (weight.packed, weight.scales, weight.biases))
    headers = [f.header for f in safetensors_files(tmp_path, True)]
    value_bytes = 4 if dtype == "float32" else 2
    others = loaded_weight_bytes(headers, value_bytes)  # the float tensors as stored, expanded linears ...
    expanded = sum(
        int(info["shape"][0]) * int(info["shape"][1]) * value_bytes
        for h in headers
        for n, info in h.items()
        if info["dtype"] == "F8_E4M3"
    )
    others -= expanded  # ... less those linears
    monkeypatch.setattr(memory, "kernel_isa", lambda: None)  # a Mac without the torch kernels built
    mlx = memory.estimate(tmp_path, kv_cache_mib=0, dtype=dtype, backend="mlx").weights
    assert mlx - others == held  # 9 bits a weight in bf16, 10 in float32
    assert held * 8 / (expanded / value_bytes) == (9.0 if dtype == "bfloat16" else 10.0)
    torch_without_kernels = memory.estimate(tmp_path, kv_cache_mib=0, dtype=dtype, backend="torch").weights
    assert torch_without_kernels - others == expanded  # the torch backend does dequantize then
