"""The many-row i-quant path (csrc/lc_iq_gemm.h): steps of 8 or more rows decode each 16 weight rows
once into an int8 panel and run every activation row over it, on AVX-512 VNNI, AVX2 and portable C.

Bounds as tests/backends/test_kernels_iquants.py: against the float64 product of the `gguf` package's
dequantized weights and the kernels' own 8-bit activations only float32 summation error may remain. The
shapes hit every edge of the tiling: weight rows that leave a partial last panel (1, 15, 17, 33), row
counts at and around the switch from the row kernel (7, 8, 9) and ragged activation tiles (13, 31, 70:
the AVX-512 tile takes 8 rows, the others 4), k of one 256-value block and of several, IQ4_NL rows of an
odd number of 32-value blocks, two segments written side by side, bfloat16 in and out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from localchat.backends.torch.cpu import kernels
from tests.helpers.iquants import random_blocks

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

TYPES = sorted(kernels.IQ_TYPES)
ISAS = kernels.runnable_isas()


def dequantized(qtype: str, blocks: np.ndarray, cols: int) -> torch.Tensor:
    values = np.asarray(dequantize(blocks, GGMLQuantizationType[qtype]), dtype=np.float32)
    return torch.from_numpy(values.reshape(-1, cols)).double()


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """The kernels' 8-bit activations as float64 (d = amax / 127 per 32 values, round half even)."""
    groups = x.float().reshape(x.shape[0], -1, 32)
    d = groups.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / torch.where(d > 0, d, 1), 0)
    return (torch.round(groups * inv).clamp(-127, 127).double() * d.double()).reshape(x.shape)


def assert_within_bounds(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, what: object) -> None:
    xq = quantized_activations(x.float())
    want = xq @ w.T
    k = x.shape[1]
    bound = (k / 4 + 8) * 2.0**-24 * (xq.abs() @ w.abs().T)
    if x.dtype == torch.bfloat16:  # the output rounded to bfloat16 too
        bound = bound + want.abs() * 2.0**-8 + 1e-6
    err = (got.double() - want).abs()
    assert (err <= bound + 1e-30).all(), (what, float(err.max()), float((err - bound).max()))


def activations(rows: int, k: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows whose 32-value groups differ in magnitude (so a scale mix-up between groups shows)."""
    gen = torch.Generator().manual_seed(seed)
    spread = torch.rand(rows, k // 32, 1, generator=gen).mul(4).expand(rows, k // 32, 32).reshape(rows, k)
    return (torch.randn(rows, k, generator=gen) * spread).to(dtype)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", TYPES)
def test_many_rows_within_bounds_on_ragged_shapes(qtype: str, isa: str) -> None:
    ops = kernels.load(isa)
    assert ops is not None
    shapes = [(1, 256), (15, 512), (17, 256), (33, 768)]
    if qtype == "IQ4_NL":  # blocks of 32: k need not be a multiple of 256
        shapes.append((17, 96))
    for n, k in shapes:
        blocks = random_blocks(qtype, n, k, seed=n + k)
        w = dequantized(qtype, blocks, k)
        matrix = kernels.BlockMatrix([kernels.Segment(qtype, torch.from_numpy(blocks))], k, ops)
        for rows in (5, 7, 8, 9, 13, 31, 70):  # 5: x86's fewest rows for the panels (LC_IQG_MIN_ROWS)
            x = activations(rows, k, seed=rows)
            assert_within_bounds(ops.matmul(x, matrix), x, w, (n, k, rows))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", ["IQ4_XS", "IQ3_XXS", "IQ2_S"])
def test_bfloat16_in_and_out(qtype: str, isa: str) -> None:
    ops = kernels.load(isa)
    assert ops is not None
    n, k = 21, 512
    blocks = random_blocks(qtype, n, k, seed=5)
    matrix = kernels.BlockMatrix([kernels.Segment(qtype, torch.from_numpy(blocks))], k, ops)
    x = activations(19, k, seed=2, dtype=torch.bfloat16)
    got = ops.matmul(x, matrix)
    assert got.dtype == torch.bfloat16
    assert_within_bounds(got, x, dequantized(qtype, blocks, k), qtype)


@pytest.mark.parametrize("isa", ISAS)
def test_two_segments_fill_their_own_columns(isa: str) -> None:
    """A fused projection (e.g. q|k|v) of two i-quant types with a partial panel at the first one's end:
    each writes its own columns of the shared output (row stride = all columns)."""
    ops = kernels.load(isa)
    assert ops is not None
    k = 512
    parts = [("IQ4_XS", 19, 1), ("IQ3_S", 24, 2)]
    segments, ws = [], []
    for qtype, n, seed in parts:
        blocks = random_blocks(qtype, n, k, seed=seed)
        segments.append(kernels.Segment(qtype, torch.from_numpy(blocks)))
        ws.append(dequantized(qtype, blocks, k))
    matrix = kernels.BlockMatrix(segments, k, ops)
    x = activations(12, k, seed=9)
    assert_within_bounds(ops.matmul(x, matrix), x, torch.cat(ws), "two segments")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", ["IQ4_XS", "IQ3_XXS", "IQ1_M"])
def test_many_row_path_agrees_with_the_row_kernel(qtype: str, isa: str) -> None:
    """8 rows in one call (the panel path) and the same rows 4 at a time (the row kernel) give the same
    outputs up to float32 summation order."""
    ops = kernels.load(isa)
    assert ops is not None
    n, k = 40, 1024
    blocks = random_blocks(qtype, n, k, seed=11)
    matrix = kernels.BlockMatrix([kernels.Segment(qtype, torch.from_numpy(blocks))], k, ops)
    x = activations(8, k, seed=4)
    many = ops.matmul(x, matrix)
    few = torch.cat([ops.matmul(x[:4], matrix), ops.matmul(x[4:], matrix)])
    scale = (quantized_activations(x).abs() @ dequantized(qtype, blocks, k).abs().T).float()
    assert ((many - few).abs() <= scale * 2e-5 + 1e-30).all(), float((many - few).abs().max())
