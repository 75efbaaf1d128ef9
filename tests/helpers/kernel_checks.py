"""What the CPU kernel suites (test_kernels_iquants.py, test_kernels_mxfp4.py, test_kernels_lowbit.py)
check alike: a block matrix's matmul against the float64 product of its dequantized weights, and a model
loaded twice, on the kernels' blocks and dequantized, the first following the second step by step.

The matmul bound: against the *same* 8-bit activations the kernels use (x ~ d * q per 32 values) only
float32 accumulation error remains, at most (terms summed serially + a few) * 2^-24 * sum |w * x| per
output (each 4-value lane is one term; the integer sums are exact). A wrong grid entry, sign or scale is
off by orders of magnitude more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.loader import load_model
from tests.helpers.parity import PROMPT
from tests.helpers.torch_batch import PagedDriver


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """The kernels' 8-bit activations, back as float64, in their float32 steps: d = amax / 127 per 32,
    q = round half even of x times 1 / d, clamped to +-127."""
    groups = x.float().reshape(x.shape[0], -1, 32)
    d = groups.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / torch.where(d > 0, d, 1), 0)
    q = torch.round(groups * inv).clamp(-127, 127)
    return (q.double() * d.double()).reshape(x.shape)


def check_matmul_bound(
    ops: Any, qtype: str, blocks: np.ndarray, w: torch.Tensor, rows: tuple[int, ...], repacks: bool = False
) -> None:
    """`blocks` ([n, k] weights of `qtype`, as the file holds them) times random activations of each row
    count in `rows`, float32 and bfloat16 in and out, within the float32 bound of `w` (their dequantized
    values, float64) times the kernels' own 8-bit activations; a bfloat16 output also within its
    rounding. `repacks`: whether `ops` has an x16 form for the type (none: the blocks are read in place)."""
    k = w.shape[1]
    matrix = kernels.BlockMatrix([kernels.Segment(qtype, torch.from_numpy(blocks))], k, ops)
    assert ops.can_repack(qtype, k) == repacks
    gen = torch.Generator().manual_seed(1)
    for n in rows:
        for dtype in (torch.float32, torch.bfloat16):
            spread = torch.rand(n, k // 32, 1, generator=gen).mul(4).expand(n, k // 32, 32)
            x = (torch.randn(n, k, generator=gen) * spread.reshape(n, k)).to(dtype)
            got = ops.matmul(x, matrix).double()
            xq = quantized_activations(x.float())
            want = xq @ w.T
            bound = (k / 4 + 8) * 2.0**-24 * (xq.abs() @ w.abs().T)
            if dtype == torch.bfloat16:  # the output rounded to bfloat16 too
                bound = bound + want.abs() * 2.0**-8 + 1e-6
            assert ((got - want).abs() <= bound + 1e-30).all(), (n, dtype, float((got - want).abs().max()))


def compact_and_dequantized(
    bundle_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[TorchRunner, TorchRunner]:
    """The model at `bundle_path` on the CPU in float32 twice: every block matrix on the kernels with no
    dense copy (int4 mode), and everything dequantized."""
    bundle = load_model(bundle_path)
    runs = []
    for mode in ("int4", "dequant"):
        monkeypatch.setenv(quant.QUANT_ENV, mode)
        runs.append(TorchRunner(bundle, RunnerOptions(device="cpu", dtype="float32")))
    return runs[0], runs[1]


def tiny_model_matrices(runner: TorchRunner) -> tuple[Any, ...]:
    """A tiny Llama's first layer's linears, its embedding and its LM head (the embedding when tied)."""
    model = runner.model
    layer: Any = model.layers[0]
    return (layer.qkv, layer.o, layer.gate_up, layer.down, model.embed, model.lm_head or model.embed)


def follow_dequantized(
    compact: TorchRunner,
    exact: TorchRunner,
    steps: int,
    prompt: list[int] = PROMPT,
    min_cosine: float = 0.995,
) -> float:
    """`prompt` prefilled on both runners (the many-row path), then `steps` one-row decode steps each fed
    the dequantized run's greedy token: the compact run's logits at cosine > `min_cosine` at every step.
    Returns the largest |logit difference| seen."""
    drivers = [PagedDriver(compact), PagedDriver(exact)]
    for driver in drivers:
        driver.add("a", prompt)
    worst = 0.0
    for _ in range(steps):
        (_, got), (_, want) = (d.step_logits() for d in drivers)
        worst = max(worst, float((got[0].float() - want[0].float()).abs().max()))
        assert F.cosine_similarity(got[0].float(), want[0].float(), dim=0) > min_cosine
        for driver in drivers:
            driver.feed("a", int(want[0].argmax()))
    return worst
