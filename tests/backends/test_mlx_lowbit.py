"""Issue #34 on MLX: GGUF NVFP4, Q1_0 and Q2_0 kept exactly in MLX's own quantization
(localchat/backends/mlx/lowbit.py): NVFP4 in the "nvfp4" mode (e4m3 scales per 16), Q1_0 as 1-bit and
Q2_0 as 2-bit affine groups of one block. Random blocks against the reference dequantizer (equal as
numbers: MLX gives -0.0 for NVFP4's code 8), and tiny GGUFs in each type against transformers on the
file's values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import torch  # noqa: E402

from localchat.backends.mlx.quant import DenseWeight, QuantizedWeight, linear, take_rows, to_weight  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from localchat.weights.lowbit import dequantize_lowbit  # noqa: E402
from localchat.weights.mlx_groups import mlx_tensor_bytes  # noqa: E402
from localchat.weights.tensors import WeightTensor  # noqa: E402
from tests.helpers.lowbit import random_lowbit_blocks  # noqa: E402
from tests.helpers.parity import ATOL, PROMPT, Driver, mlx_runner  # noqa: E402
from tests.helpers.parity import hf_logits_np as hf_logits  # noqa: E402
from tests.helpers.torch_models import tiny_hf_model  # noqa: E402

pytestmark = pytest.mark.mlx

FORMS = {"NVFP4": ("nvfp4", 4, 16), "Q1_0": ("affine", 1, 128), "Q2_0": ("affine", 2, 64)}
ROWS, COLS = 8, 512


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("qtype", sorted(FORMS))
def test_blocks_map_exactly(qtype: str, dtype: str) -> None:
    blocks = random_lowbit_blocks(qtype, ROWS, COLS, seed=21, any_scale=dtype == "float32")
    if qtype == "NVFP4":
        blocks.reshape(-1, 36)[:, :4][blocks.reshape(-1, 36)[:, :4] == 0xFF] = 0x7F  # 0xFF: no MLX form
    weight = to_weight(WeightTensor("w", (ROWS, COLS), qtype, blocks), getattr(mx, dtype))
    assert isinstance(weight, QuantizedWeight)
    assert (weight.mode, weight.bits, weight.group_size) == FORMS[qtype]
    reference = dequantize_lowbit(blocks, qtype).reshape(ROWS, COLS)
    kept = np.array(take_rows(weight, mx.arange(ROWS)).astype(mx.float32))
    if dtype == "float32":
        np.testing.assert_array_equal(kept, reference)  # every value, zeros and subnormal scales too
    else:  # scale and bias rounded to bfloat16 (as every MLX affine group's), then s q + b in bfloat16:
        # within a few bf16 roundings of the block's d (measured: 0.0087 relative at most)
        d = np.abs(reference).reshape(ROWS, -1, FORMS[qtype][2]).max(-1, keepdims=True)
        err = np.abs(kept - reference).reshape(ROWS, -1, FORMS[qtype][2])
        assert (err <= 6 * 2.0**-9 * d).all()
    assert mlx_tensor_bytes(qtype, [COLS, ROWS], blocks.nbytes, 4 if dtype == "float32" else 2) == sum(
        a.nbytes for a in (weight.packed, weight.scales, weight.biases) if a is not None
    )
    if dtype == "float32":
        x = np.random.default_rng(12).standard_normal((3, COLS)).astype(np.float32)
        np.testing.assert_allclose(
            np.array(linear(mx.array(x), weight)),
            x @ reference.T,
            rtol=1e-4,
            atol=1e-4 * np.abs(reference).max(),
        )


def test_nvfp4_scale_0xff_is_expanded() -> None:
    """ggml reads 0xFF as 480 / 2, which no e4m3 byte holds: that matrix is dense, with ggml's values."""
    blocks = random_lowbit_blocks("NVFP4", ROWS, COLS, seed=3)
    blocks[2, 1] = 0xFF
    weight = to_weight(WeightTensor("w", (ROWS, COLS), "NVFP4", blocks), mx.float32)
    assert isinstance(weight, DenseWeight)
    np.testing.assert_array_equal(
        np.array(weight.wt).T, dequantize_lowbit(blocks, "NVFP4").reshape(ROWS, COLS)
    )


@pytest.mark.parametrize("qtype", sorted(FORMS))
def test_tiny_gguf_stays_quantized_and_equals_the_file(tmp_path: Path, qtype: str) -> None:
    """Every linear and the embedding stay in MLX's form of the type; transformers on the file's values
    gives the same logits (exact mapping: the MLX run is the file's model)."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=256, intermediate_size=512)
    bundle = load_model(
        write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    )
    weights = list(bundle.iter_weights())
    assert sum(w.dtype == qtype for w in weights) >= 14
    exact = {w.name: np.array(w.dequantize()) for w in weights}
    hf.load_state_dict({n: torch.from_numpy(v) for n, v in exact.items()}, strict=False)
    runner = mlx_runner(bundle)
    layer = runner.model.layers[0]
    for matrix in (layer.qkv, layer.o, layer.gate_up, layer.down, runner.model.embed):
        assert isinstance(matrix, QuantizedWeight) and (matrix.mode, matrix.bits) == FORMS[qtype][:2]
    driver = Driver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - hf_logits(hf, PROMPT)).max() < ATOL


def test_modelopt_nvfp4_folder_runs_in_mlx_nvfp4(tmp_path: Path) -> None:
    """A ModelOpt NVFP4 checkpoint (repacked at load into GGUF NVFP4 blocks, weights/hf_nvfp4.py) keeps its
    layer linears in MLX's nvfp4 mode and gives transformers' logits on the repacked values."""
    from tests.backends.test_hf_nvfp4 import MODELOPT_CONFIG, modelopt_quantizer
    from tests.helpers.quant_folders import save_quantized_llama

    hf = tiny_hf_model("llama", hidden_size=128, intermediate_size=256)
    save_quantized_llama(tmp_path, hf, modelopt_quantizer, MODELOPT_CONFIG)
    bundle = load_model(tmp_path)
    kept = {w.name: w.dequantize() for w in bundle.iter_weights() if w.dtype == "NVFP4"}
    config: Any = hf.config
    assert len(kept) == 7 * config.num_hidden_layers
    hf.load_state_dict({n: torch.from_numpy(np.array(v)) for n, v in kept.items()}, strict=False)
    runner = mlx_runner(bundle)
    layer = runner.model.layers[0]
    for matrix in (layer.qkv, layer.o, layer.gate_up, layer.down):
        assert isinstance(matrix, QuantizedWeight) and matrix.mode == "nvfp4"
    driver = Driver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - hf_logits(hf, PROMPT)).max() < ATOL
