"""Issue #33: GPTQ / AWQ-style int4 checkpoints under `--tp 2` keep each rank's slice of every linear as the
repacked Q4_1 blocks (parallel/shard_int4.py) instead of dequantizing it to float32 per rank.

The cuts, against the unsharded repack (`repack_int4`, group sizes 32 and 128, act-order and without): a
rank's rows and its 32-aligned input columns are the whole linear's blocks byte for byte with their zeros
(so the kernels run the same weights on each rank), and dequantize to the whole one's exact values there;
act-order columns scattered across blocks shared with the other rank keep the exact float32 columns. A
planted cut (each rank taking the first groups' scales with its own codes) fails that comparison. Over
gloo (2 processes), tiny Llama GPTQ folders (test_hf_quant_compact.py's): TP=2 gives one device's greedy
tokens and float32 logits within 1e-4 with the exact values, and on the CPU kernels one device's greedy
tokens and logits within KERNEL_ATOL (act-order: REPACK_ATOL, its float32 columns skip Q4_1's rounded m)
with rank 0's linears Q4_1 blocks of half the bytes."""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from localchat.arch.registry import architecture
from localchat.backends import RunnerOptions
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.shard_int4 import act_order_mlp, int4_columns, int4_rows
from localchat.backends.torch.quant import PermutedWeight
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.hf_quant_blocks import BLOCK, RepackedLinear, repack_int4
from localchat.weights.loader import load_model
from localchat.weights.tensors import WeightTensor
from tests.backends.test_hf_quant_compact import CASES, REPACK_ATOL, linears, run, write_checkpoint
from tests.helpers.parity import tiny_tokenizer_json
from tests.helpers.quant_folders import quantize_tensors, save_quantized
from tests.helpers.torch_models import tiny_hf_model
from tests.helpers.tp_parity import TP2, assert_tp_parity

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

# GPTQ with and without act-order, AWQ (GEMM) and symmetric compressed-tensors W4A16 (Q4_0 blocks)
INT4 = ["gptq-g32", "gptq-g128", "gptq-g32-act-order", "gptq-g128-act-order", "awq-g32", "ct-w4a16-g32"]
# One device and TP=2 both run the same Q4_1 blocks with precise activations quantized per 32-value
# block (the ranks' cuts fall on those blocks); they differ by the all-reduce's summation order
KERNEL_ATOL = 1e-3
Q4_1_BYTES = 20


def _linear(rows: int, cols: int, group: int, act_order: bool, seed: int) -> RepackedLinear:
    """A GPTQ-style asymmetric int4 linear: act-order assigns groups along a random column permutation."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(cols) if act_order else np.arange(cols)
    column_groups = np.empty(cols, np.int64)
    column_groups[perm] = np.arange(cols) // group
    codes = rng.integers(0, 16, (rows, cols))
    scales = rng.uniform(0.01, 0.1, (rows, cols // group)).astype(np.float16)
    zeros = rng.integers(0, 16, (rows, cols // group))
    linear = repack_int4("w", codes, scales, zeros, column_groups)
    assert linear is not None and linear.qtype == "Q4_1"
    return linear


def assert_cut_of_whole(whole: RepackedLinear, part: RepackedLinear, start: int, count: int) -> None:
    """`part` is input columns [start, start + count) of `whole`: its exact values there, and each of its
    blocks (scale, m, codes) one of the whole's blocks of only those columns, with that block's zeros."""
    np.testing.assert_array_equal(part.dequantize(), whole.dequantize()[:, start : start + count])
    rows = whole.shape[0]
    mine = np.arange(whole.shape[1]) if whole.order is None else whole.order
    in_cut = ((mine >= start) & (mine < start + count)).reshape(-1, BLOCK).all(axis=1)
    whole_blocks = np.asarray(whole.data).reshape(rows, -1, Q4_1_BYTES)[:, in_cut]
    np.testing.assert_array_equal(np.asarray(part.data).reshape(rows, -1, Q4_1_BYTES), whole_blocks)
    np.testing.assert_array_equal(part.zeros, whole.zeros[:, in_cut])


@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize("group", [32, 128])
def test_row_cuts_are_the_whole_linears_blocks(group: int, act_order: bool) -> None:
    whole = _linear(96, 256, group, act_order, seed=group)
    values, blocks = whole.dequantize(), np.asarray(whole.data)
    for ranges in ([(0, 48)], [(48, 48)], [(0, 16), (40, 16), (80, 16)]):
        cut = int4_rows(whole, ranges)
        picked = np.concatenate([np.arange(s, s + c) for s, c in ranges])
        assert type(cut) is RepackedLinear and cut.shape == (len(picked), 256)
        np.testing.assert_array_equal(cut.data, blocks[picked])
        np.testing.assert_array_equal(cut.zeros, whole.zeros[picked])
        np.testing.assert_array_equal(cut.dequantize(), values[picked])
        assert (cut.order is None) == (whole.order is None)


@pytest.mark.parametrize("group", [32, 128])
def test_column_cuts_keep_whole_blocks_off_group_boundaries(group: int) -> None:
    """Without act-order every 32-aligned cut is blocks, also one inside a group of 128."""
    whole = _linear(64, 512, group, False, seed=group)
    for start, count in ((0, 256), (256, 256), (64, 64), (96, 160)):
        part = int4_columns(whole, start, count)
        assert isinstance(part, RepackedLinear) and part.shape == (64, count) and part.order is None
        assert_cut_of_whole(whole, part, start, count)
        assert np.asarray(part.data).nbytes == count // BLOCK * Q4_1_BYTES * 64
    split = int4_columns(whole, 16, 48)  # splits blocks: the rank's exact values, float32
    assert not isinstance(split, RepackedLinear) and split.dtype == "F32"
    np.testing.assert_array_equal(split.data, whole.dequantize()[:, 16:64])


def test_act_order_columns_keep_blocks_only_where_the_rank_owns_them_whole() -> None:
    whole = _linear(64, 256, 32, True, seed=3)  # groups along a random permutation: scattered
    for start in (0, 128):
        part = int4_columns(whole, start, 128)
        assert not isinstance(part, RepackedLinear) and part.dtype == "F32"
        np.testing.assert_array_equal(part.data, whole.dequantize()[:, start : start + 128])
    # act-order within each half (a permutation that keeps the halves apart): the halves' blocks
    rng = np.random.default_rng(4)
    perm = np.concatenate([rng.permutation(128), 128 + rng.permutation(128)])
    groups = np.empty(256, np.int64)
    groups[perm] = np.arange(256) // 32
    scales = rng.uniform(0.01, 0.1, (64, 8)).astype(np.float16)
    halves = repack_int4("w", rng.integers(0, 16, (64, 256)), scales, rng.integers(0, 16, (64, 8)), groups)
    assert halves is not None and halves.order is not None
    for start in (0, 128):
        part = int4_columns(halves, start, 128)
        assert isinstance(part, RepackedLinear) and part.order is not None
        assert_cut_of_whole(halves, part, start, 128)


@pytest.mark.parametrize("down_first", [False, True], ids=["gate-up-first", "down-first"])
def test_act_order_mlp_is_permuted_into_downs_stored_order(down_first: bool) -> None:
    """Gate / up rows and down's input columns permuted alike: the same MLP, down's blocks in input order
    (each rank's contiguous cut then whole blocks), gate / up still their blocks."""
    prefix = "model.layers.0.mlp."
    gate, up = (
        replace(_linear(256, 64, 32, True, seed=s), name=f"{prefix}{n}_proj.weight")
        for s, n in ((5, "gate"), (6, "up"))
    )
    down = replace(_linear(64, 256, 32, True, seed=7), name=f"{prefix}down_proj.weight")
    stream = [down, gate, up] if down_first else [gate, up, down]
    out = {w.name: w for w in act_order_mlp(stream, architecture("llama"))}
    new_down = out[down.name]
    assert type(new_down) is RepackedLinear and new_down.order is None
    assert int4_columns(new_down, 128, 128).shape == (64, 128)  # a rank's cut: blocks
    assert isinstance(int4_columns(new_down, 128, 128), RepackedLinear)
    x = np.random.default_rng(8).standard_normal((3, 64))

    def mlp(g: WeightTensor, u: WeightTensor, d: WeightTensor) -> np.ndarray:
        a, b = x @ g.dequantize().T, x @ u.dequantize().T
        return (a / (1 + np.exp(-a)) * b) @ d.dequantize().T

    new = mlp(out[gate.name], out[up.name], new_down)
    np.testing.assert_allclose(new, mlp(gate, up, down), rtol=1e-5, atol=1e-6)
    assert type(out[gate.name]) is RepackedLinear


def _first_groups_scales(w: RepackedLinear, start: int, count: int) -> WeightTensor:
    """A planted bug: the rank's codes, but the scale and m of the linear's first blocks (rank 0's)."""
    part = cast(RepackedLinear, int4_columns(w, start, count))
    data = np.asarray(part.data).reshape(w.shape[0], -1, Q4_1_BYTES).copy()
    first = np.asarray(w.data).reshape(w.shape[0], -1, Q4_1_BYTES)[:, : data.shape[1]]
    data[..., :4] = first[..., :4]
    zeros = w.zeros[:, : data.shape[1]]
    return replace(part, data=data.reshape(w.shape[0], -1), zeros=np.ascontiguousarray(zeros))


@pytest.mark.parametrize("group", [32, 128])
def test_a_rank_taking_the_first_groups_scales_is_caught(group: int) -> None:
    whole = _linear(64, 256, group, False, seed=group + 1)
    assert_cut_of_whole(whole, cast(RepackedLinear, _first_groups_scales(whole, 0, 128)), 0, 128)  # rank 0
    with pytest.raises(AssertionError):
        assert_cut_of_whole(whole, cast(RepackedLinear, _first_groups_scales(whole, 128, 128)), 128, 128)


def _folder(tmp_path_factory: pytest.TempPathFactory, case: str) -> Path:
    folder = tmp_path_factory.mktemp(case)
    write_checkpoint(folder, *CASES[case])
    return folder


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("case", ["gptq-g128", "gptq-g32-act-order"])
def test_int4_tp2_matches_one_device_exactly(tmp_path_factory: pytest.TempPathFactory, case: str) -> None:
    """The exact int4 values (each rank's blocks dequantized at load): float32 parity."""
    folder = _folder(tmp_path_factory, case)

    def check(local: object) -> None:
        layer = local.model.layers[0]  # type: ignore[attr-defined]
        assert tuple(layer.o.shape) == (128, 64) and tuple(layer.down.shape) == (128, 128)

    assert_tp_parity(functools.partial(load_model, folder), TP2, check)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("case", INT4)
def test_int4_tp2_on_the_kernels_keeps_rank_blocks(
    tmp_path_factory: pytest.TempPathFactory, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q4_1 blocks on every rank (the workers inherit the environment): one device's greedy tokens, rank 0's
    compact linears half the one device's bytes; act-order's scattered o / down columns are float32."""
    folder = _folder(tmp_path_factory, case)
    torch.set_num_threads(1)
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "int4")
    monkeypatch.setenv("LOCALCHAT_KERNEL_ACTIVATIONS", "precise")
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1)
    one = TorchRunner(load_model(folder), options)
    want_logits, want_tokens = run(one)
    assert os.environ["LOCALCHAT_TORCH_QUANT"] == "int4"
    runner = ParallelRunner(load_model(folder), TP2)
    try:
        names = ("qkv", "o", "gate_up", "down")
        mine = dict(
            zip(
                (f"{i}.{n}" for i in range(len(one.model.layers)) for n in names),
                linears(runner.runner),
                strict=True,
            )
        )
        whole = dict(zip(mine, linears(one), strict=True))
        # act-order's o (g32: several groups over its input) keeps float32 columns; down's MLP is permuted
        # into its stored order, so its blocks are cut in order (no PermutedWeight)
        scattered = ("o",) if case == "gptq-g32-act-order" else ()
        for name, weight in mine.items():
            if name.endswith(scattered):
                assert isinstance(weight, torch.Tensor) and weight.dtype == torch.float32, name
                continue
            matrix = weight.matrix if isinstance(weight, PermutedWeight) else weight
            assert isinstance(matrix, BlockMatrix), name
            assert {s.qtype for s in matrix.segments} == {"Q4_0" if case.startswith("ct") else "Q4_1"}, name
            permuted = isinstance(whole[name], PermutedWeight) and not name.endswith("down")
            assert isinstance(weight, PermutedWeight) == permuted, name
            one_matrix = getattr(whole[name], "matrix", whole[name])
            assert isinstance(one_matrix, BlockMatrix), name
            assert 2 * matrix.nbytes == one_matrix.nbytes, name  # half the blocks (the order is not cut)
        logits, tokens = run(cast(TorchRunner, runner))
    finally:
        runner.shutdown()
    assert tokens == want_tokens
    err = (logits - want_logits).abs().max().item()
    print(f"int4 {case} TP=2 on the kernels: max |logit diff| vs one device {err:.2e}")
    # act-order's float32 o / down hold the exact (q - z) s where one device's blocks hold d q + m (m
    # rounded to fp16): test_hf_quant_compact's bound for that rounding
    assert err < (REPACK_ATOL if scattered else KERNEL_ATOL)


# test_hf_fp8_moe_mla's layout at hidden 128: layer 0 four experts 64 wide (a rank's 32 columns of an
# expert's down are one block), layer 1 a dense MLP 256 wide
MOE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE GPTQ folder, groups of 32 in act-order: each expert's down has two groups
    scattered over its 64 inputs."""
    folder = tmp_path_factory.mktemp("qwen3-moe-gptq")
    hf = tiny_hf_model("qwen3_moe", **MOE)
    hf.save_pretrained(folder)  # type: ignore[operator]
    named: list[tuple[str, torch.Tensor]] = []
    for name, tensor in hf.state_dict().items():  # the hub's layout: one gate / up / down per expert
        if name.endswith("experts.gate_up_proj"):
            width = tensor.shape[1] // 2
            for e, fused in enumerate(tensor):
                named += [(f"{name.removesuffix('gate_up_proj')}{e}.gate_proj.weight", fused[:width])]
                named += [(f"{name.removesuffix('gate_up_proj')}{e}.up_proj.weight", fused[width:])]
        elif name.endswith("experts.down_proj"):
            named += [
                (f"{name.removesuffix('down_proj')}{e}.down_proj.weight", down)
                for e, down in enumerate(tensor)
            ]
        else:
            named.append((name, tensor))
    quantizer, qconfig = CASES["gptq-g32-act-order"]
    state, _ = quantize_tensors(
        named, lambda n, _: quantizer if "layers." in n and n.endswith("_proj.weight") else None
    )
    save_quantized(folder, state, qconfig, tiny_tokenizer_json())
    return folder


@pytest.mark.slow  # spawns gloo ranks
def test_int4_moe_tp2_matches_one_device_exactly(moe_folder: Path) -> None:
    """Every expert's MLP permuted into its own down's stored order: float32 parity with one device."""
    assert_tp_parity(functools.partial(load_model, moe_folder), TP2)


@pytest.mark.slow  # spawns gloo ranks
def test_int4_moe_tp2_on_the_kernels_keeps_expert_blocks(
    moe_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "int4")
    monkeypatch.setenv("LOCALCHAT_KERNEL_ACTIVATIONS", "precise")
    one = TorchRunner(load_model(moe_folder), RunnerOptions(device="cpu", dtype="float32", num_threads=1))
    want_logits, want_tokens = run(one)
    runner = ParallelRunner(load_model(moe_folder), TP2)
    try:
        experts: Any = runner.runner.model.layers[0].moe.experts  # type: ignore[union-attr]
        for e, expert in enumerate(experts):
            assert isinstance(expert.down, BlockMatrix), e  # in order now: no PermutedWeight
            assert {s.qtype for s in expert.down.segments} == {"Q4_1"}, e
            assert tuple(expert.down.shape) == (128, 32), e
            assert isinstance(expert.gate_up, PermutedWeight | BlockMatrix), e
        logits, tokens = run(cast(TorchRunner, runner))
    finally:
        runner.shutdown()
    assert tokens == want_tokens
    err = (logits - want_logits).abs().max().item()
    print(f"int4 qwen3_moe g32 act-order TP=2 on the kernels: max |logit diff| vs one device {err:.2e}")
    assert err < REPACK_ATOL  # o's float32 columns: the exact values, one device's rounded m
