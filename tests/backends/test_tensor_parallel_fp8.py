"""A DeepSeek-V3 FP8 checkpoint folder (block-scaled e4m3 with a `weight_scale_inv` per 128 x 128 tile,
the hub's layout) under `--tp 2`: each rank keeps its slice of every FP8 linear compact, its codes with
the scales that cover them (parallel/shard_q8.py), cut by head (MLA's q_b / kv_b rows, o's value
columns) and by width (experts, shared expert, dense MLP).

The cuts, against the whole linear: every row / column slice dequantizes to the whole one's values
there, and where it stays compact its Q8_0 blocks are the whole linear's blocks byte for byte (so the
kernels run the same weights on each rank). Over gloo (2 processes): TP=2 gives one device's greedy
tokens and float32 logits within 1e-4 with the exact fp8 values (dequantized at load), and on the CPU
kernels (Q8_0) one device's greedy tokens with rank 0's expert and MLA matrices Q8_0 blocks."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from safetensors import safe_open

from localchat.backends import RunnerOptions
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.shard_q8 import q8_columns, q8_rows
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.hf_q8_blocks import Q8_0_BYTES, Q8Linear, q8_linear
from localchat.weights.loader import load_model
from tests.backends import test_hf_fp8_moe_mla as fp8_moe
from tests.backends.test_hf_fp8_compact import fp8_block_parts
from tests.backends.test_hf_quant_compact import run
from tests.helpers.parity import tiny_tokenizer_json
from tests.helpers.quant_folders import save_quantized
from tests.helpers.torch_models import tiny_hf_model
from tests.helpers.tp_parity import TP2, assert_tp_parity

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

# test_hf_fp8_moe_mla's tiny V3 (hidden 128, 4 heads, low-rank q) with experts 64 wide: a rank's 32
# columns of down are whole Q8_0 blocks
V3 = ("deepseek_v3", {**fp8_moe.MODELS["deepseek_v3"][1], "moe_intermediate_size": 64})


def _linear(rows: int, cols: int, block: tuple[int, int] | None, seed: int) -> Q8Linear:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x10  # no NaN codes
    shape = (1,) if block is None else (-(-rows // block[0]), -(-cols // block[1]))
    linear = q8_linear("w", codes, rng.uniform(0.5, 2.0, shape).astype(np.float32), block or (1, 1))
    assert linear is not None
    return linear


@pytest.mark.parametrize("block", [(128, 128), (64, 32), None], ids=["128x128", "64x32", "per-tensor"])
def test_cuts_keep_the_values_and_the_q8_0_blocks(block: tuple[int, int] | None) -> None:
    whole = _linear(300, 256, block, seed=1)
    values, blocks = whole.dequantize(), whole.blocks().data
    for ranges in ([(0, 128)], [(128, 128)], [(48, 48)], [(250, 50)], [(0, 24), (100, 24), (200, 24)]):
        cut = q8_rows(whole, ranges)
        picked = np.concatenate([np.arange(s, s + c) for s, c in ranges])
        assert isinstance(cut, Q8Linear) and cut.shape == (len(picked), 256)
        np.testing.assert_array_equal(cut.dequantize(), values[picked])
        np.testing.assert_array_equal(cut.blocks().data, blocks[picked])
    for start, count in ((0, 128), (128, 128), (32, 64), (96, 160), (64, 32)):
        part = q8_columns(whole, start, count)
        assert isinstance(part, Q8Linear) and part.shape == (300, count)
        np.testing.assert_array_equal(part.dequantize(), values[:, start : start + count])
        first = start // 32 * Q8_0_BYTES
        np.testing.assert_array_equal(part.blocks().data, blocks[:, first : first + count // 32 * Q8_0_BYTES])
    split = q8_columns(whole, 16, 48)  # splits Q8_0 blocks: the rank's exact values, float32
    assert not isinstance(split, Q8Linear) and split.dtype == "F32"
    np.testing.assert_array_equal(split.data, values[:, 16:64])


def write_v3_fp8(folder: Path, block: int) -> None:
    """The tiny V3 saved as the hub has it: every layer linear e4m3 codes + a `weight_scale_inv` per
    block x block tile (DeepSeek's 128; 32 gives these 128-wide tensors several tiles to pick from)."""
    model_type, overrides = V3
    tiny_hf_model(model_type, seed=fp8_moe.SEED, **overrides).save_pretrained(folder)  # type: ignore[operator]
    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("model*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                tensor = handle.get_tensor(name)
                if fp8_moe._quantized_name(name) and tensor.dim() == 2:
                    parts, _ = fp8_block_parts(tensor.float().numpy(), block)
                    state.update({f"{name.removesuffix('.weight')}.{k}": v for k, v in parts.items()})
                else:
                    state[name] = tensor.contiguous()
    for index in folder.glob("model.safetensors.index.json"):
        index.unlink()
    config = {**fp8_moe.FP8_CONFIG, "weight_block_size": [block, block]}
    save_quantized(folder, state, config, tiny_tokenizer_json())


@pytest.fixture(scope="module", params=[128, 32], ids=["tiles-128", "tiles-32"])
def folder(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    folder = tmp_path_factory.mktemp(f"v3-fp8-{request.param}")
    write_v3_fp8(folder, request.param)
    return folder


@pytest.mark.slow  # spawns gloo ranks
def test_fp8_deepseek_v3_tp2_matches_one_device_exactly(folder: Path) -> None:
    """The exact fp8 values (each rank's compact slice dequantized at load): float32 parity."""

    def check(local: Any) -> None:
        layer = local.model.layers[1]  # MoE: 2 of 4 heads, every expert at 32 of 64 wide
        assert layer.mla.heads == 2 and tuple(layer.moe.experts[0].down.shape) == (128, 32)

    assert_tp_parity(functools.partial(load_model, folder), TP2, check)


@pytest.mark.slow  # spawns gloo ranks
def test_fp8_deepseek_v3_tp2_on_the_kernels_matches_one_device(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q8_0 blocks on every rank (the workers inherit the environment): one device's greedy tokens."""
    torch.set_num_threads(1)
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "int4")
    monkeypatch.setenv("LOCALCHAT_KERNEL_ACTIVATIONS", "precise")
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1)
    want_logits, want_tokens = run(TorchRunner(load_model(folder), options))
    assert os.environ["LOCALCHAT_TORCH_QUANT"] == "int4"
    runner = ParallelRunner(load_model(folder), TP2)
    try:
        packed = fp8_moe.compact_params(runner.runner)
        assert any(".experts." in k for k in packed) and any(k.endswith(".kv_b") for k in packed)
        for name, weight in packed.items():
            assert isinstance(weight, BlockMatrix), name
            assert {s.qtype for s in weight.segments} == {"Q8_0"}, name
        logits, tokens = run(cast(TorchRunner, runner))
    finally:
        runner.shutdown()
    assert tokens == want_tokens
    err = (logits - want_logits).abs().max().item()
    print(f"fp8 deepseek_v3 TP=2 on the kernels: max |logit diff| vs one device {err:.2e}")
    assert err < 1e-3


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("variant", ["qwen3_5", "qwen3_next"])
def test_fp8_deltanet_tp2_matches_one_device(tmp_path: Path, variant: str) -> None:
    """Qwen's FP8 layout of a gated DeltaNet model (test_hf_fp8_deltanet.py: qkv / z / out and Qwen3-Next's
    grouped qkvz in 128 x 128 tiles, b / a in bf16): each rank's q | k | v, z rows and out columns of its
    heads stay compact (several row ranges of one linear: per-row scales); one device's greedy tokens and
    float32 logits within 1e-4 with the exact values, the recurrent state in slots."""
    from tests.backends.test_hf_fp8_deltanet import write_fp8_hybrid

    write_fp8_hybrid(tmp_path, variant)
    assert_tp_parity(functools.partial(load_model, tmp_path), TP2)
