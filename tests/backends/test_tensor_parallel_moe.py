"""gpt-oss, GLM-4.5 and Llama 4 under tensor parallelism (parallel/shard_moe.py): Llama's layer cut by
head, each MoE's experts (and shared expert) cut along their width with every expert on every rank, the
router replicated. Tiny random transformers models of each family (the families' own parity suites'),
TP=2 (gloo, 2 processes) and TP=2 x PP=2 (4 processes) give one device's greedy tokens and float32
logits within 1e-4, ragged then decode and chunked with a preemption (tests/helpers/tp_parity.py).

gpt-oss: attention sinks per head, q/k/v/o biases, a 4-token window on even layers, biased clamped
SwiGLU experts; from float weights, the hub's MXFP4 experts and llama.cpp's converter's MXFP4 GGUF.
GLM-4.5: q/k/v biases, q/k norm, half-rotary heads, a dense first layer, the grouped sigmoid router
with its selection bias, a shared expert. Llama 4: L2 q/k norm, NoPE layers with the q temperature, top-1
sigmoid routing that scales the expert's input, a shared expert, interleaved dense layers."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localchat.arch import gpt_oss
from localchat.backends.torch.parallel.group import ParallelGroup
from localchat.backends.torch.parallel.shard_weights import RankSlice, shard_weights
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity


def gpt_oss_bundle() -> ModelBundle:
    from tests.backends.test_gpt_oss import tiny_gpt_oss

    return bundle_from_hf(tiny_gpt_oss())


def glm_bundle() -> ModelBundle:
    from tests.backends.test_glm4_moe import VARIANTS

    return bundle_from_hf(tiny_hf_model("glm4_moe", **VARIANTS["glm4_moe"]))


def llama4_bundle(variant: str) -> ModelBundle:
    from tests.backends.test_llama4 import VARIANTS

    return bundle_from_hf(tiny_hf_model("llama4_text", **VARIANTS[variant]))


def _mxfp4_folder(folder: Path, intermediate: int) -> Path:
    """The hub's form of a tiny gpt-oss (MXFP4 experts: blocks of 32 along each input) with experts
    `intermediate` wide, and a harmony vocabulary llama.cpp's converter takes."""
    from tests.backends import test_gpt_oss
    from tests.backends.test_gpt_oss_gguf import mxfp4_model, tiny_model
    from tests.helpers.gpt_oss_gguf import save_folder

    old = test_gpt_oss.TINY["intermediate_size"]
    test_gpt_oss.TINY["intermediate_size"] = intermediate
    try:
        hf = tiny_model(seed=3)
    finally:
        test_gpt_oss.TINY["intermediate_size"] = old
    return save_folder(hf, folder, mxfp4_model(hf))


def _rank0(bundle: ModelBundle) -> dict[str, Any]:
    """Rank 0's slice of every weight of the first layer's expert 0 and attention, by name."""
    part = RankSlice.of(bundle.config, ParallelGroup(0, 2))
    wanted = ("layers.0.mlp.experts.0.", "layers.0.self_attn.sinks")
    return {
        w.name: w
        for w in shard_weights(bundle.iter_weights(), bundle.config, part)
        if any(k in w.name for k in wanted)
    }


@pytest.mark.parametrize(("intermediate", "blocks_kept"), [(64, True), (32, False)])
def test_mxfp4_down_is_cut_on_block_boundaries_or_dequantized(
    tmp_path: Path, intermediate: int, blocks_kept: bool
) -> None:
    """gate|up's rows stay MXFP4 blocks; down's input columns stay blocks when a rank's half of the width
    is a multiple of 32 (64 -> 32), and are its exact float32 columns otherwise (32 -> 16)."""
    bundle = load_model(_mxfp4_folder(tmp_path, intermediate))
    stream = gpt_oss.sanitize(bundle.config, bundle.iter_weights())  # experts one by one
    whole = {w.name: w for w in stream if "layers.0.mlp.experts.0." in w.name}
    mine = _rank0(bundle)
    half = intermediate // 2
    gate_up, down = (
        mine["model.layers.0.mlp.experts.0.gate_up.weight"],
        mine["model.layers.0.mlp.experts.0.down.weight"],
    )
    assert (gate_up.dtype, gate_up.shape) == ("MXFP4", (2 * half, 64))  # half the gate rows, half the up rows
    want_gate_up = whole["model.layers.0.mlp.experts.0.gate_up.weight"].dequantize()
    np.testing.assert_array_equal(
        gate_up.dequantize(),
        np.concatenate((want_gate_up[:half], want_gate_up[intermediate : intermediate + half])),
    )
    assert down.shape == (64, half) and down.dtype == ("MXFP4" if blocks_kept else "F32")
    np.testing.assert_array_equal(
        down.dequantize(), whole["model.layers.0.mlp.experts.0.down.weight"].dequantize()[:, :half]
    )
    bias = mine["model.layers.0.mlp.experts.0.gate_up.bias"]
    assert bias.shape == (2 * half,)
    assert mine["model.layers.0.self_attn.sinks"].shape == (2,)  # 2 of the 4 heads' sinks


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("options", [TP2, TP2_PP2], ids=["tp2", "tp2xpp2"])
def test_gpt_oss(options: Any) -> None:
    def check(local: Any) -> None:
        layer = local.model.layers[0]
        assert (layer.heads, layer.kv_heads, tuple(layer.sinks.shape)) == (2, 1, (2,))
        assert layer.attn_options.window == 4 and layer.attn_options.sinks is layer.sinks
        expert = layer.moe.experts[5]
        assert tuple(expert.gate_up.shape) == (32, 64) and tuple(expert.down.shape) == (64, 16)

    assert_tp_parity(gpt_oss_bundle, options, check)


@pytest.mark.slow  # spawns gloo ranks; runs llama.cpp's converter
@pytest.mark.parametrize("form", ["hub-mxfp4", "gguf-mxfp4"])
def test_gpt_oss_mxfp4(tmp_path: Path, form: str) -> None:
    """Experts 64 wide: each rank's down keeps whole MXFP4 blocks (32 of 64 input columns)."""
    from tests.helpers.gpt_oss_gguf import convert_gpt_oss

    folder = _mxfp4_folder(tmp_path / "hf", 64)
    path = folder if form == "hub-mxfp4" else convert_gpt_oss(folder, tmp_path / "tiny-mxfp4.gguf")

    def check(local: Any) -> None:
        assert tuple(local.model.layers[1].moe.experts[0].down.shape) == (64, 32)

    assert_tp_parity(functools.partial(load_model, str(path)), TP2, check)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("options", [TP2, TP2_PP2], ids=["tp2", "tp2xpp2"])
def test_glm4_moe(options: Any) -> None:
    def check(local: Any) -> None:
        dense = local.model.layers[0]
        assert tuple(dense.down.shape) == (64, 64)  # the first layer's dense MLP: 128 -> 64
        if options is TP2_PP2:
            return  # rank 0's stage holds that layer only
        sparse = local.model.layers[1]
        assert tuple(sparse.moe.experts[3].down.shape) == (64, 16)  # experts: 32 -> 16
        assert tuple(sparse.moe.shared.down.shape) == (64, 16)
        assert tuple(sparse.moe.router.shape) == (4, 64) and tuple(sparse.moe.score_bias.shape) == (4,)

    assert_tp_parity(glm_bundle, options, check)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize(
    ("variant", "options"),
    [("llama4", TP2), ("llama4-interleaved", TP2), ("llama4-interleaved", TP2_PP2)],
    ids=["scout-tp2", "interleaved-tp2", "interleaved-tp2xpp2"],
)
def test_llama4(variant: str, options: Any) -> None:
    def check(local: Any) -> None:
        layers = list(local.model.layers)
        moe = next(layer.moe for layer in layers if layer.moe is not None)
        assert tuple(moe.experts[0].down.shape) == (64, 16) and tuple(moe.shared.down.shape) == (64, 16)
        dense = [layer for layer in layers if layer.moe is None]
        assert all(tuple(layer.down.shape) == (64, 48) for layer in dense)  # intermediate_size_mlp 96

    assert_tp_parity(functools.partial(llama4_bundle, variant), options, check)


def _glm_gguf(path: Path) -> Path:
    """tests/backends/test_glm4_moe.py's Q8_0 file: one multi-token-prediction block after the layers."""
    from tests.backends.test_glm4_moe import VARIANTS, write_glm4_moe_gguf
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE

    overrides = {"partial_rotary_factor": 0.5, "n_group": 1, "topk_group": 1, "vocab_size": TINY_VOCAB_SIZE}
    return write_glm4_moe_gguf(path, tiny_hf_model("glm4_moe", **{**VARIANTS["glm4_moe"], **overrides}))


def _llama4_gguf(path: Path) -> Path:
    """tests/backends/test_llama4.py's Q8_0 file: q/k rows as in the checkpoint, experts [E, out, in]."""
    from tests.backends.test_llama4 import VARIANTS, write_llama4_gguf
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE

    overrides = {"floor_scale": 8192, "attn_scale": 0.1, "vocab_size": TINY_VOCAB_SIZE}
    return write_llama4_gguf(path, tiny_hf_model("llama4_text", **{**VARIANTS["llama4"], **overrides}))


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("family", ["glm4_moe", "llama4"])
def test_q8_0_gguf(tmp_path: Path, family: str) -> None:
    """llama.cpp's layout in Q8_0 blocks: GLM's multi-token-prediction block is cut and then dropped at
    load; Llama 4's q/k rows are reordered at load within each of the rank's heads."""
    write = _glm_gguf if family == "glm4_moe" else _llama4_gguf
    path = write(tmp_path / f"{family}.gguf")

    def check(local: Any) -> None:
        assert len(local.model.layers) == (2 if family == "glm4_moe" else 4)  # no MTP layer
        assert tuple(local.model.layers[1].moe.experts[0].down.shape) == (64, 16)

    assert_tp_parity(functools.partial(load_model, str(path)), TP2, check)
