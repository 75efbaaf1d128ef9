"""Issue #34: 4-bit GPTQ (with and without act-order), AWQ (GEMM) and compressed-tensors W4A16 linears stay
compact on localchat's CPU kernels: repacked at load into GGUF Q4_1 (d = s, m = -s z rounded to fp16) or,
for symmetric compressed-tensors, Q4_0 (bit-exact). Checkpoints are written here by the formats' documented
packing (test_hf_quant.py's writers); the compact run's logits and greedy tokens match the exactly
dequantized run (test_hf_quant.py checks that one against transformers)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from localchat.backends import RunnerOptions
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.quant import PermutedWeight, _log_dense_int4
from localchat.backends.torch.runner import TorchRunner
from localchat.models import memory
from localchat.weights.hf_quant import loaded_weight_bytes
from localchat.weights.hf_quant_blocks import RepackedLinear, repack_int4
from localchat.weights.loader import load_model
from localchat.weights.safetensors import safetensors_files
from tests.backends.test_hf_quant import CASES as EXACT_CASES
from tests.backends.test_hf_quant import gptq_case, gptq_parts
from tests.backends.test_tensor_parallel import _run as tp_run
from tests.backends.test_tensor_parallel_quant import _runner as tp_runner
from tests.backends.test_tensor_parallel_quant import _worker as tp_worker
from tests.helpers.parity import PROMPT
from tests.helpers.quant_folders import Quantizer, save_quantized_llama
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner, tiny_hf_model

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

# hidden 128, MLP 256: every linear's input holds at least one group of 128 (o_proj's: 4 heads of 32)
SHAPE = {"hidden_size": 128, "intermediate_size": 256}
CASES: dict[str, tuple[Quantizer, dict[str, Any]]] = {
    "gptq-g32": EXACT_CASES["gptq-g32"],
    "gptq-g128": gptq_case(128, False),
    "gptq-g32-act-order": gptq_case(32, True),
    # groups of 128 over inputs of 128 are one group (nothing to reorder) except down_proj's 256 inputs
    "gptq-g128-act-order": gptq_case(128, True),
    "awq-g32": EXACT_CASES["awq-g32"],
    "ct-w4a16-g32": EXACT_CASES["ct-w4a16-g32"],
}
DECODE_STEPS = 6
# Logits are of order 1-10 here. The compact run differs from the exact one by two roundings: each weight's
# m (<= half an fp16 ulp of s z, test_repack_bound), measured up to 0.025 on the logits (a dense run on the
# blocks' own values d q + m shows it alone: about 0.4% of a 4-bit step per weight, these tiny models' weights
# are wide), and the kernels' precise activations (~15 bits, test_kernels_precise.py), measured up to 1e-3
# against that dense run.
REPACK_ATOL = 0.08
KERNEL_ATOL = 5e-3


def write_checkpoint(tmp: Path, quantizer: Quantizer, qconfig: dict[str, Any]) -> None:
    """A tiny Llama (SHAPE) with every layer linear quantized by `quantizer`, the rest as is."""
    save_quantized_llama(tmp, tiny_hf_model("llama", **SHAPE), quantizer, qconfig)


def compact_runner(folder: Path, monkeypatch: pytest.MonkeyPatch) -> TorchRunner:
    """float32 compute on the kernels (`int4`: also where the ISA's many-row path is the portable one),
    precise activations as `auto` gives a small model."""
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "int4")
    monkeypatch.setenv("LOCALCHAT_KERNEL_ACTIVATIONS", "precise")
    return TorchRunner(load_model(folder), RunnerOptions(device="cpu", dtype="float32"))


def run(runner: TorchRunner) -> tuple[torch.Tensor, list[int]]:
    """The prompt's logits (every position), then greedy decode steps' logits and tokens."""
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, prompt_logits = driver.step_logits(every_token=True)
    rows, tokens, logits = [prompt_logits], [], prompt_logits
    for _ in range(DECODE_STEPS):
        tokens.append(int(logits[-1].argmax()))
        driver.feed("a", tokens[-1])
        _, logits = driver.step_logits()
        rows.append(logits)
    return torch.cat(rows).float(), tokens


def block_values(self: RepackedLinear) -> np.ndarray:
    """The blocks' own values (d q + m, as the kernels read them) in the input's column order."""
    stored = dequantize(np.asarray(self.data), GGMLQuantizationType[self.qtype]).reshape(self.shape)
    if self.order is None:
        return stored.astype(np.float32)
    values = np.empty_like(stored, dtype=np.float32)
    values[:, self.order] = stored
    return values


def linears(runner: TorchRunner) -> list[object]:
    return [getattr(layer, name) for layer in runner.model.layers for name in ("qkv", "o", "gate_up", "down")]


def resident_bytes(weight: object) -> int:
    if isinstance(weight, PermutedWeight):
        return weight.matrix.nbytes + weight.order.numel() * weight.order.element_size()
    if isinstance(weight, BlockMatrix):
        return weight.nbytes
    assert isinstance(weight, torch.Tensor)
    return weight.numel() * weight.element_size()


@pytest.mark.parametrize("case", list(CASES))
def test_int4_checkpoint_loads_compact_and_matches_the_dequantized_run(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_checkpoint(tmp_path, *CASES[case])
    exact = fp32_runner(load_model(tmp_path))  # LOCALCHAT_TORCH_QUANT=dequant: today's float32 path
    compact = compact_runner(tmp_path, monkeypatch)
    dense_linears, compact_linears = linears(exact), linears(compact)
    assert all(isinstance(w, torch.Tensor) for w in dense_linears)
    assert all(isinstance(w, BlockMatrix | PermutedWeight) for w in compact_linears)
    qtypes = {s.qtype for w in compact_linears for s in getattr(w, "matrix", w).segments}  # type: ignore[attr-defined]
    assert qtypes == ({"Q4_0"} if case.startswith("ct") else {"Q4_1"})
    permuted = [w for w in compact_linears if isinstance(w, PermutedWeight)]
    if case == "gptq-g32-act-order":
        assert len(permuted) == len(compact_linears)
    elif case == "gptq-g128-act-order":
        assert permuted and all(any(w is layer.down for layer in compact.model.layers) for w in permuted)
    else:
        assert not permuted

    ref_logits, ref_tokens = run(exact)
    got_logits, got_tokens = run(compact)
    monkeypatch.setattr(RepackedLinear, "dequantize", block_values)
    blocks_logits, _ = run(fp32_runner(load_model(tmp_path)))
    assert got_tokens == ref_tokens
    assert (got_logits - ref_logits).abs().max().item() < REPACK_ATOL
    assert (got_logits - blocks_logits).abs().max().item() < KERNEL_ATOL
    if case.startswith("ct"):  # Q4_0 holds a symmetric checkpoint exactly: only the kernels' rounding
        assert (got_logits - ref_logits).abs().max().item() < KERNEL_ATOL

    dense = sum(resident_bytes(w) for w in dense_linears)
    packed = sum(resident_bytes(w) for w in compact_linears)
    weights = sum(w.numel() for w in dense_linears if isinstance(w, torch.Tensor))
    with capsys.disabled():  # the numbers the report quotes (pytest -s not needed)
        print(
            f"\n{case}: linears {packed} B compact vs {dense} B float32 ({dense // 2} B bf16): "
            f"{8 * packed / weights:.2f} bits per weight; max |logit diff| "
            f"{(got_logits - ref_logits).abs().max().item():.2e}"
        )
    assert packed * 6 < dense  # ~5 bits (x16 panels included) vs 32


def test_repack_bound() -> None:
    """Q4_1's d q + m vs the checkpoint's (q - z) s: |error| <= half an fp16 ulp of s z, plus float32's
    rounding of d q + m itself (gguf's dequantizer computes in float32, as the kernels do). Q4_0 from a
    symmetric checkpoint is exact."""
    rng = np.random.default_rng(3)
    out, cols, group = 16, 256, 64
    codes = rng.integers(0, 16, (out, cols))
    scales = rng.uniform(1e-4, 0.5, (out, cols // group)).astype(np.float16)
    zeros = rng.integers(0, 17, (out, cols // group))  # GPTQ v1 may give 16
    column_groups = np.arange(cols) // group
    exact = (codes - zeros[:, column_groups]) * scales.astype(np.float32)[:, column_groups]
    linear = repack_int4("w", codes, scales, zeros, column_groups)
    assert linear is not None and linear.qtype == "Q4_1" and linear.order is None
    got = dequantize(linear.data, GGMLQuantizationType.Q4_1).reshape(out, cols)
    sz = (scales.astype(np.float32) * zeros)[:, column_groups]
    half_ulp = np.spacing(np.abs(sz).astype(np.float16)).astype(np.float32) / 2
    bound = half_ulp + np.spacing(np.abs(exact).astype(np.float32))
    assert np.all(np.abs(got - exact) <= bound)
    assert np.abs(got - exact).max() > 0  # the bound is reached in part: m does round
    assert np.array_equal(linear.dequantize(), exact.astype(np.float32))  # the dense fallback stays exact

    symmetric = repack_int4("w", codes, scales, None, column_groups)
    assert symmetric is not None and symmetric.qtype == "Q4_0"
    values = (codes - 8) * scales.astype(np.float32)[:, column_groups]
    assert np.array_equal(dequantize(symmetric.data, GGMLQuantizationType.Q4_0).reshape(out, cols), values)


def test_act_order_groups_become_contiguous_blocks() -> None:
    """A shuffled g_idx: the stored columns are the input's in `order`, each 32 of one group; the exact
    form puts them back."""
    rng = np.random.default_rng(5)
    out, cols, group = 16, 128, 32
    column_groups = np.empty(cols, np.int64)
    column_groups[rng.permutation(cols)] = np.arange(cols) // group
    codes = rng.integers(0, 16, (out, cols))
    scales = rng.uniform(0.01, 0.1, (out, cols // group)).astype(np.float16)
    zeros = rng.integers(1, 16, (out, cols // group))
    linear = repack_int4("w", codes, scales, zeros, column_groups)
    assert linear is not None and linear.order is not None
    assert np.all(np.diff(column_groups[linear.order]) >= 0)
    stored = dequantize(linear.data, GGMLQuantizationType.Q4_1).reshape(out, cols)
    exact = (codes - zeros[:, column_groups]) * scales.astype(np.float32)[:, column_groups]
    assert np.allclose(stored, exact[:, linear.order], atol=1e-3)
    assert np.array_equal(linear.dequantize(), exact.astype(np.float32))


def test_groups_that_split_a_block_stay_dequantized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Group 16 (two groups per 32-value block): the dense float32 path, with a log line."""
    write_checkpoint(tmp_path, lambda w: gptq_parts(w, 16, False), {"quant_method": "gptq", "group_size": 16})
    with caplog.at_level(logging.INFO, logger="localchat.weights.hf_quant"):
        runner = compact_runner(tmp_path, monkeypatch)
    assert all(isinstance(w, torch.Tensor) for w in linears(runner))
    assert "14 quantized linears dequantized at load" in caplog.text and "multiple of 32" in caplog.text


def test_without_kernels_the_linears_are_the_exact_dense_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """LOCALCHAT_KERNELS=off (as without the extension, or on CUDA/MPS): today's dequantized tensors, bit
    for bit, and a log line saying why."""
    write_checkpoint(tmp_path, *CASES["gptq-g32-act-order"])
    exact = fp32_runner(load_model(tmp_path))
    monkeypatch.setenv("LOCALCHAT_KERNELS", "off")
    _log_dense_int4.cache_clear()  # said once a process: maybe already, by an earlier test's load
    with caplog.at_level(logging.INFO, logger="localchat.backends.torch.quant"):
        off = TorchRunner(load_model(tmp_path), RunnerOptions(device="cpu", dtype="float32"))
    for ours, ref in zip(linears(off), linears(exact), strict=True):
        assert isinstance(ours, torch.Tensor) and isinstance(ref, torch.Tensor) and torch.equal(ours, ref)
    assert "int4 linears are dequantized to the compute dtype" in caplog.text


def test_ram_estimate_counts_compact_int4(tmp_path: Path) -> None:
    """The pre-load check sizes the int4 linears at Q4_1's 5 bits where the kernels keep them."""
    write_checkpoint(tmp_path, *CASES["gptq-g32"])
    headers = [f.header for f in safetensors_files(tmp_path, True)]
    expanded = loaded_weight_bytes(headers, 2)
    blocks = loaded_weight_bytes(headers, 2, compact=True)
    # 2 layers of q (128x128), k and v (64x128), o (128x128), gate and up (256x128), down (128x256)
    values = 2 * (128 * 128 * 2 + 64 * 128 * 2 + 256 * 128 * 3)
    assert expanded - blocks == values * 2 - values * 20 // 32  # bf16 values -> Q4_1's 20 bytes per 32
    est = memory.estimate(tmp_path, kv_cache_mib=0, dtype="bfloat16")
    assert est.weights == blocks


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tensor_parallel_ranks_cut_the_exact_values(tmp_path: Path) -> None:
    """Tensor-parallel ranks (gloo, 2 CPU processes) cut an act-order GPTQ folder loaded as exact
    float32 values (the dequantized path; the compact per-rank cut is test_tensor_parallel_int4.py's):
    TP=2 gives TP=1's logits and tokens."""
    folder = tmp_path / "model"
    write_checkpoint(folder, *CASES["gptq-g32-act-order"])
    torch.set_num_threads(1)
    expected_logits, expected_tokens = tp_run(tp_runner(str(folder), True))
    out = tmp_path / "rank0.pt"
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(
        tp_worker, args=(2, init, str(folder), True, str(out)), nprocs=2, join=True, start_method="spawn"
    )
    (logits, tokens), _, _ = torch.load(out, weights_only=False)
    assert tokens == expected_tokens
    for ours, ref in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_bfloat16_compute_takes_the_blocks_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 (the default on CPUs with native bf16): act-order blocks give the dense bf16 run's tokens."""
    write_checkpoint(tmp_path, *CASES["gptq-g32-act-order"])
    options = RunnerOptions(device="cpu", dtype="bfloat16")
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "dequant")
    _, dense_tokens = run(TorchRunner(load_model(tmp_path), options))
    monkeypatch.setenv("LOCALCHAT_TORCH_QUANT", "auto")
    compact = TorchRunner(load_model(tmp_path), options)
    assert all(isinstance(w, PermutedWeight) for w in linears(compact))
    assert run(compact)[1] == dense_tokens
