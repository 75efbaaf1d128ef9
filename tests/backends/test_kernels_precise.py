"""Precise activations (`LOCALCHAT_KERNEL_ACTIVATIONS=precise`, csrc/lc_kernels.c's lc_linear): each
activation row is rounded to 8 bits per 32 values, the residual x - d q is rounded to 8 bits again, and
both rows go through the same integer dot products, their outputs added.

Bounds, as in test_kernels_matmul.py: against the float64 product with the *same* two rounded forms only
float32 summation error remains (each form's recursive-summation bound, plus one float32 add); against
the exact activations the error is the residual's rounding, |r - d2 q2| <= d2 / 2 with d2 = max|r| / 127
<= d / 254: about 250x below the plain 8-bit form's, which the last assertion of each case also checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.loader import load_model
from tests.backends.test_kernels_matmul import K_QUANTS, SIMPLE, activations, rounded, weights
from tests.helpers.real_model import PROMPTS, chat_prompts, greedy
from tests.helpers.torch_batch import PagedDriver

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")
ISAS = kernels.runnable_isas()


def summation(xr: np.ndarray, w: np.ndarray, cols: int) -> np.ndarray:
    """test_kernels_matmul.py's float32 accumulation bound for one rounded activation form."""
    largest = np.repeat(np.abs(w).reshape(w.shape[0], -1, 16).max(axis=-1), 16, axis=1)
    return (cols / 4 + 16) * 2.0**-24 * (np.abs(xr) @ (3 * largest).T)


def products(qtype: str, isa: str, rows: int, dtype: torch.dtype) -> tuple[np.ndarray, ...]:
    """(precise output, plain 8-bit output, the dequantized weights, the activations the kernel saw)."""
    raw = weights(qtype, 23, 512, seed=rows)
    x_in = torch.from_numpy(activations(rows, 512, seed=rows)).to(dtype)
    ops = kernels.load(isa)
    assert ops is not None
    out = []
    for precise in (True, False):
        bound = kernels.Kernels(ops.lib, ops.isa, precise=precise)
        matrix = kernels.BlockMatrix([kernels.Segment(qtype, torch.from_numpy(raw))], 512, bound)
        out.append(ops.matmul(x_in, matrix).double().numpy())
    w = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float64)
    return out[0], out[1], w, x_in.float().numpy()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [*SIMPLE, *K_QUANTS])
# 1-2 rows: the few-row path with the residual rows beside them; 3 and 70: the many-row path, 70 across
# two rounds of LC_PRECISE_ROWS (64)
@pytest.mark.parametrize("rows", [1, 2, 3, 70])
def test_precise_activations_round_the_residual_too(qtype: str, isa: str, rows: int) -> None:
    got, plain, w, x = products(qtype, isa, rows, torch.float32)
    first, d = rounded(x)
    residual = (x - first.astype(np.float32)).astype(np.float32)  # what the kernel computes, in float32
    second, d2 = rounded(residual)
    both = (first + second) @ w.T
    bound = summation(first, w, 512) + summation(second, w, 512) + 2.0**-23 * np.abs(both)
    assert np.all(np.abs(got - both) <= bound + 1e-30), (qtype, isa, rows)
    exact = x.astype(np.float64) @ w.T
    assert np.all(np.abs(got - exact) <= (d2 / 2) @ np.abs(w).T + bound + 1e-30)
    assert np.all(d2 <= d / 254 * (1 + 2.0**-20) + 1e-30)
    # the point of it: far closer to the exact product than the plain 8-bit form
    assert np.abs(got - exact).max() * 50 < np.abs(plain - exact).max()


@pytest.mark.parametrize("isa", ISAS)
def test_precise_bfloat16_in_and_out(isa: str) -> None:
    """bf16 activations are widened before both roundings; the sum is rounded to bf16 once."""
    got, _, w, x = products("Q4_1", isa, 2, torch.bfloat16)
    exact = x.astype(np.float64) @ w.T
    assert np.all(np.abs(got - exact) <= 2.0**-8 * np.abs(exact) + 1e-3 * (np.abs(x) @ np.abs(w).T) / 127)


def test_policy_reads_the_activation_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.delenv(quant.QUANT_ENV, raising=False)
    monkeypatch.setenv(kernels.KERNELS_ENV, "auto")
    monkeypatch.delenv(quant.ACTIVATIONS_ENV, raising=False)
    # auto: precise for small models (SmolLM2's answers need it), llama.cpp's q8 numerics above the limit
    limit, ram = quant.SMALL_MODEL_BYTES, 64 << 30
    assert quant.pick_policy(cpu, torch.bfloat16, limit, ram).precise
    assert not quant.pick_policy(cpu, torch.bfloat16, limit + 1, ram).precise
    monkeypatch.setenv(quant.ACTIVATIONS_ENV, "q8")
    assert not quant.pick_policy(cpu, torch.bfloat16, 100, 1000).precise
    monkeypatch.setenv(quant.ACTIVATIONS_ENV, "precise")
    assert quant.pick_policy(cpu, torch.bfloat16, limit + 1, ram).precise
    assert quant.pick_policy(cpu, torch.bfloat16, 100, 1000).precise
    assert quant.pick_policy(cpu, torch.float32, 100, 1000).precise == (ISAS[-1] in quant.FAST_GEMM_ISAS)
    monkeypatch.setenv(quant.QUANT_ENV, "dequant")  # no block matrices: nothing to make precise
    assert not quant.pick_policy(cpu, torch.float32, 100, 1000).precise
    monkeypatch.setenv(quant.ACTIVATIONS_ENV, "fp16")
    with pytest.raises(BackendUnavailableError, match="auto, q8, precise"):
        quant.pick_policy(cpu, torch.bfloat16, 100, 1000)


def test_q4_models_of_every_size_stay_in_blocks_without_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Q4_0/Q4_1 linears used to take torch's int4 kernel + bf16 copies while the copies were small
    (SmolLM2): now every size runs its blocks on the kernels, with no copy on the SIMD GEMMs (memory: the
    file); `copies` still buys prefill speed with memory."""
    cpu = torch.device("cpu")
    monkeypatch.delenv(quant.QUANT_ENV, raising=False)
    monkeypatch.setenv(kernels.KERNELS_ENV, "auto")
    ram = 64 << 30
    for size in (100 << 20, quant.SMALL_MODEL_BYTES, 4 << 30):
        policy = quant.pick_policy(cpu, torch.bfloat16, size, ram)
        assert policy.kernels is not None and not policy.int4
        assert policy.block_copies == (policy.kernels.name not in quant.FAST_GEMM_ISAS)
    monkeypatch.setenv(quant.QUANT_ENV, "copies")  # asked for: speed for memory at any size
    assert quant.pick_policy(cpu, torch.bfloat16, 100 << 20, ram).block_copies
    assert not quant.pick_policy(cpu, torch.bfloat16, 100 << 20, 100 << 20).block_copies  # no room for them


def teacher_forced_logits(
    runner: TorchRunner, prompts: list[list[int]], tokens: list[list[int]]
) -> np.ndarray:
    rows = []
    for prompt, follow in zip(prompts, tokens, strict=True):
        driver = PagedDriver(runner, num_blocks=64, block_size=16)
        driver.add("a", prompt)
        for token in follow[:16]:
            _, logits = driver.step_logits()
            rows.append(logits[0].float().numpy())
            driver.feed("a", token)
    return np.stack(rows)


@pytest.mark.slow
def test_smollm2_float32_precise_matches_the_dequantized_reference(
    smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp32 compute + precise activations is within rounding of the exact run: teacher-forcing the
    reference's greedy tokens (3 prompts x 16 steps), the logits stay within 0.05 (dev box: max 0.006;
    plain 8-bit activations: 1.9) and the greedy text is identical."""
    bundle = load_model(smollm2_gguf)
    prompts = chat_prompts(bundle)
    monkeypatch.setenv(kernels.KERNELS_ENV, "auto")
    monkeypatch.setenv(quant.QUANT_ENV, "dequant")
    reference = TorchRunner(bundle, RunnerOptions(device="cpu", dtype="float32"))
    monkeypatch.setenv(quant.QUANT_ENV, "int4")  # every matrix on the kernels, whatever the CPU
    monkeypatch.setenv(quant.ACTIVATIONS_ENV, "precise")
    ours = TorchRunner(bundle, RunnerOptions(device="cpu", dtype="float32"))
    layer = ours.model.layers[0]
    assert isinstance(layer.qkv, kernels.BlockMatrix) and layer.qkv.precise and layer.down.precise
    assert "(precise activations)" in ours.device_name and "precise" not in reference.device_name
    want = greedy(reference, bundle, prompts)
    error = np.abs(
        teacher_forced_logits(ours, prompts, want) - teacher_forced_logits(reference, prompts, want)
    )
    assert error.max() < 0.05, error.max()
    assert greedy(ours, bundle, prompts) == want, PROMPTS
