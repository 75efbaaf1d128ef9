"""Issue #34: the pre-load RAM check sizes a GGUF as the MLX backend holds it. MLX keeps Q4_0 / Q8_0 /
Q4_K / Q5_K as exact affine groups and re-quantizes Q6_K, Q3_K, Q2_K and the i-quants to min/max groups
(backends/mlx/quant.py), each with a scale and a bias per 32 values in the compute dtype; float tensors
are held at the compute dtype. Before, the estimate sized a GGUF as the torch CPU kernels hold it (file
size): a Q3_K matrix at its 3.44 bits a weight where MLX holds 6 (bf16) or 7 (float32). Held to the real
loaded MLX arrays' nbytes (MLX's CPU device) of tiny GGUF files written with the gguf package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

mx = pytest.importorskip("mlx.core")

from gguf import GGMLQuantizationType  # noqa: E402

from localchat.backends.mlx.quant import REQUANTIZED, DenseWeight, QuantizedWeight  # noqa: E402
from localchat.models import memory  # noqa: E402
from localchat.weights.gguf import open_gguf  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.helpers.parity import mlx_runner  # noqa: E402
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.mlx

QTYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_XS", "F16"]
# The estimate reads the tensor table and the loader's type table, so it is exact for these llama files
# (measured: 0 bytes off); the slack is for what a family adds beyond that table (float32 parameters,
# matrices a sanitize rebuilds). Counting a re-quantized type at its file size misses by 27-56% here.
TOLERANCE = 0.01


def held_bytes(runner: object) -> int:
    """The nbytes of every array the checkpoint filled: embedding, final norm, LM head and each layer's
    declared weights (their MLX form: packed codes, scales and biases, or the dense array)."""

    def arrays(value: object) -> list[Any]:
        if isinstance(value, list):
            return [a for v in value for a in arrays(v)]
        if isinstance(value, QuantizedWeight):
            return [value.packed, value.scales, value.biases]
        if isinstance(value, DenseWeight):
            return [value.wt]
        return [] if value is None else [value]

    model = runner.model  # type: ignore[attr-defined]
    found = arrays([model.embed, model.norm, model.lm_head])
    for layer in model.layers:
        found += arrays([getattr(layer, attr) for attr in {k.split(".")[0] for k in layer.shapes}])
    return sum(a.nbytes for a in {id(a): a for a in found}.values())


def file_sized(path: Path, value_bytes: int) -> int:
    """What the estimate would say had it taken each quantized tensor at its file size (floats at the
    compute dtype, as MLX holds them): the failure this test must catch."""
    total = 0
    for t in open_gguf(path).tensors:
        kind = GGMLQuantizationType(t.tensor_type).name
        float_type = kind in ("F32", "F16", "BF16")
        total += int(t.n_elements) * value_bytes if float_type else int(t.n_bytes)
    return total


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("qtype", QTYPES)
def test_estimate_sizes_each_gguf_type_as_mlx_holds_it(
    tmp_path: Path, qtype: str, dtype: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny_config("llama")
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype.lower()}.gguf", random_state_dict(cfg), cfg, qtype=qtype)
    held = held_bytes(mlx_runner(load_model(path), dtype))
    estimated = memory.estimate(path, kv_cache_mib=0, dtype=dtype, backend="mlx").weights
    value_bytes = 4 if dtype == "float32" else 2
    as_file = file_sized(path, value_bytes)
    with capsys.disabled():
        print(
            f"\n{qtype} {dtype}: MLX holds {held} bytes, estimate {estimated} "
            f"({estimated / held - 1:+.2%}), file-sized {as_file} ({as_file / held - 1:+.1%})"
        )
    assert abs(estimated - held) <= TOLERANCE * held
    if qtype in REQUANTIZED:  # the test tells the file's size from MLX's
        assert abs(as_file - held) > 10 * TOLERANCE * held


def test_mlx_auto_dtype_is_float32_on_its_cpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate's compute dtype follows MLX's runner.pick_dtype: float32 on the CPU device (so the
    groups' scales and biases take 4 bytes each), 2 bytes on Metal."""
    from localchat.backends.mlx.runner import pick_dtype

    assert pick_dtype("auto", mx.Device(mx.cpu), "bfloat16") == mx.float32
    monkeypatch.setattr(memory.sys, "platform", "linux")
    assert memory.compute_dtype("auto", "auto", "mlx") == "float32"
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    monkeypatch.setattr(memory.platform, "machine", lambda: "arm64")
    assert memory.compute_dtype("auto", "auto", "mlx") == "bfloat16"
    assert memory.compute_dtype("auto", "cpu", "mlx") == "float32"
    assert memory.compute_dtype("auto", "auto", "auto") == "bfloat16"  # auto is MLX on Apple Silicon
    assert memory.compute_dtype("float16", "cpu", "mlx") == "float16"
