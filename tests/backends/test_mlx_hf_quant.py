"""Issue #34 on MLX: Hugging Face FP8 / compressed-tensors 8-bit and GPTQ / compressed-tensors int4 folders
stay quantized: the linears hf_quant hands over as GGUF blocks (Q8_0, Q4_1, Q4_0) map onto MLX affine groups
of 32 exactly (quant.py), so MLX runs the same values as the torch kernels. Checked against transformers:
on the blocks' own values (parity: the model runs on them as stored) and on the checkpoint's exact
dequantized values (the error the blocks add, test_hf_fp8_compact.py states it; greedy tokens equal)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import torch  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from localchat.backends.mlx.quant import DenseWeight, QuantizedWeight  # noqa: E402
from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from localchat.weights.hf_quant_blocks import RepackedLinear  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_hf_fp8_compact import CASES, Q8_ATOL, SEED, write_folder  # noqa: E402
from tests.backends.test_hf_quant import ct_config, ct_int_parts, gptq_parts  # noqa: E402
from tests.helpers.parity import (  # noqa: E402
    ATOL,
    GREEDY,
    PROMPT,
    Driver,
    hf_generate,
    mlx_runner,
)
from tests.helpers.parity import hf_logits_np as hf_logits  # noqa: E402

pytestmark = pytest.mark.mlx

MLX_CASES = {
    **{k: CASES[k] for k in ("fp8-block128", "ct-fp8-channel", "ct-w8a8-int8")},
    "gptq-g32": (lambda w: gptq_parts(w, 32, False), {"quant_method": "gptq", "bits": 4, "group_size": 32}),
    "ct-w4a16-g32": (lambda w: ct_int_parts(w, 4, 32), ct_config("pack-quantized", "int", 4, "group", 32)),
}
# seed 2 (SEED) has a 0.006 greedy tie in its GPTQ model; seed 0 is test_hf_quant_compact.py's
SEEDS = {"gptq-g32": 0, "ct-w4a16-g32": 0}
BITS = {"fp8-block128": 8, "ct-fp8-channel": 8, "ct-w8a8-int8": 8, "gptq-g32": 4, "ct-w4a16-g32": 4}


def _layer_linears(runner: MLXRunner) -> list[object]:
    return [getattr(layer, n) for layer in runner.model.layers for n in ("qkv", "o", "gate_up", "down")]


@pytest.mark.parametrize("case", list(MLX_CASES))
def test_hf_quantized_folder_stays_quantized_on_mlx(tmp_path: Path, case: str) -> None:
    hf = write_folder(tmp_path, *MLX_CASES[case], seed=SEEDS.get(case, SEED))
    exact_logits = hf_logits(hf, PROMPT)
    exact_tokens = hf_generate(hf, PROMPT, 6)
    bundle = load_model(tmp_path)
    runner = mlx_runner(bundle)
    assert all(
        isinstance(w, QuantizedWeight) and w.bits == BITS[case] and w.group_size == 32
        for w in _layer_linears(runner)
    )
    driver = Driver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(5):
        driver.step()
    assert driver.tokens("a")[len(PROMPT) :] == exact_tokens
    assert np.abs(logits - exact_logits).max() < Q8_ATOL

    # transformers on the blocks' own values: MLX runs exactly those
    blocks = {
        w.name: dequantize(np.asarray(w.blocks().data), GGMLQuantizationType[w.qtype]).reshape(w.shape)
        for w in bundle.iter_weights()
        if isinstance(w, RepackedLinear)
    }
    assert len(blocks) == 14  # 2 layers x q, k, v, o, gate, up, down
    hf.load_state_dict({n: torch.from_numpy(v.astype(np.float32)) for n, v in blocks.items()}, strict=False)
    assert np.abs(logits - hf_logits(hf, PROMPT)).max() < ATOL


def test_act_order_gptq_stays_dense_exact_on_mlx(tmp_path: Path) -> None:
    """Act-order blocks hold reordered columns: MLX takes the exact dequantized values (dense)."""
    hf = write_folder(
        tmp_path,
        lambda w: gptq_parts(w, 32, True),
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True},
    )
    runner = mlx_runner(load_model(tmp_path))
    assert all(isinstance(w, DenseWeight) for w in _layer_linears(runner))
    driver = Driver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - hf_logits(hf, PROMPT)).max() < ATOL
