"""localchat's CPU kernels (csrc/, localchat/kernels/, localchat/backends/torch/cpu/kernels.py): matmul straight from GGUF blocks.

Reference: the `gguf` package's dequantizer, multiplied in float64. The kernels round each 32 values of
the activations to 8 bits (x ~ d * q, d = amax / 127, q = round(x / d)), so two bounds:

- against the float64 product with the *same* rounded activations, only float32 accumulation error
  remains: at most (terms summed serially + a few) * 2^-24 * sum of the terms' magnitudes (the standard
  bound for recursive summation). The portable path sums one term per 4 values (K / 4), the SIMD ones
  fewer. The terms are scale * code * x and offset * x, each at most 3x the largest |w| of their 16
  values (codes are unsigned: Q4_0 is d * q - 8d with |d * q| <= 15|d|, Q8_0 d * (q + 128) - 128d, and
  the K-quants' min is the block minimum). This pins the integer dot products, the scales and every
  offset: a wrong nibble, scale or sign is off by orders of magnitude more.
- against the float64 product with the exact activations: additionally |x - d q| <= d / 2 per value,
  so at most sum_j |w_j| * d_block(j) / 2 (the documented cost of 8-bit activations).

Every ISA this machine runs is checked, plus the portable C one; shapes cover the decode path (1-4
rows), the tiled path (more rows, a partial tile), row counts that are no multiple of any tile, K
not a multiple of 256 for the 32-value formats, and K of 512+ (the few-row Q4_0/Q4_1 16-block rounds);
the many-row GEMMs get every type at odd shapes, extreme scales, and the largest codes against +-127
activations (AVX2's int16 pair sums must not saturate).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from localchat.backends.torch.cpu import kernels
from tests.helpers import kquants

SIMPLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
K_QUANTS = dict(kquants.K_QUANTIZERS)  # Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
# Every ISA this CPU runs, and the AVX2 and AVX-512 kernels once more on the x16 layout (blocks repacked
# into panels of 16 rows at load: csrc/lc_x16_layout.h) for the types it holds.
X16_ISAS = [isa for isa in ("avx2", "avx512vnni", "neon") if isa in kernels.runnable_isas()]
ISAS = kernels.runnable_isas() + [f"{isa}+x16" for isa in X16_ISAS]
X16_TYPES = (*SIMPLE, *K_QUANTS)  # every block type has an x16 form


def test_the_extension_is_built_where_a_compiler_is() -> None:
    """CI installs with a compiler: a silently missing extension would only leave the slow path."""
    if shutil.which("cc") or shutil.which("gcc"):
        assert "portable" in ISAS, "localchat/_lckernels was not built (pip install -e . builds it)"
    if not ISAS:
        pytest.skip("no C compiler: the extension is optional")


def weights(qtype: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """GGUF blocks [rows, bytes] of random weights whose 32-value groups span extreme scales."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    scales = rng.choice([1e-4, 1e-2, 1.0, 40.0], size=(rows, cols // 32)).astype(np.float32)
    values *= np.repeat(scales, 32, axis=1)
    values[0, :32] = 0.0  # an all-zero block
    if qtype in K_QUANTS:
        return K_QUANTS[qtype](values)
    return quantize(values, GGMLQuantizationType[qtype])


def activations(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x *= np.repeat(rng.choice([1e-3, 1.0, 300.0], size=(rows, cols // 32)), 32, axis=1).astype(np.float32)
    x[:, 32:64] = 0.0  # an all-zero activation block
    x[0, 5] = 5000.0  # an outlier: its block's other values round coarsely
    return x


def rounded(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' 8-bit activations (float32 arithmetic, round half to even) -> (d * q, d per value)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.rint(blocks * inv), -127, 127)
    return (q * d).reshape(x.shape).astype(np.float64), np.broadcast_to(d, blocks.shape).reshape(x.shape)


def check(qtype: str, isa: str, rows: int, out_features: int, cols: int, dtype: torch.dtype) -> None:
    raw = weights(qtype, out_features, cols, seed=rows * 7 + out_features)
    compare(qtype, isa, raw, activations(rows, cols, seed=rows), dtype)


def compare(qtype: str, isa: str, raw: np.ndarray, x: np.ndarray, dtype: torch.dtype) -> None:
    """The kernel's product of blocks `raw` and activations `x` within the bounds above."""
    w = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float64)
    rows, cols = x.shape
    out_features = w.shape[0]
    x_in = torch.from_numpy(x).to(dtype)
    x = x_in.double().numpy()  # what the kernel sees (bf16 inputs are rounded already)
    isa, _, layout = isa.partition("+")
    ops = kernels.load(isa)
    assert ops is not None
    segment = kernels.Segment(qtype, torch.from_numpy(raw))
    if layout:
        segment = ops.repack(segment, cols)
        assert segment.packed_rows == out_features and segment.data.shape[0] == -(-out_features // 16)
    matrix = kernels.BlockMatrix([segment], cols, ops)
    got = ops.matmul(x_in, matrix).double().numpy()
    xr, d = rounded(x.astype(np.float32))
    exact_q = xr @ w.T
    largest = np.repeat(np.abs(w).reshape(out_features, -1, 16).max(axis=-1), 16, axis=1)
    terms = kquants.term_sizes(qtype, raw)  # Q2_K/Q3_K terms can exceed 3x their group's |w|
    if terms is not None:
        largest = np.maximum(largest, terms / 3)
    out_rounding = 2.0**-8 * np.abs(exact_q) if dtype == torch.bfloat16 else 0.0
    summation = (cols / 4 + 16) * 2.0**-24 * (np.abs(xr) @ (3 * largest).T)
    assert np.all(np.abs(got - exact_q) <= summation + out_rounding + 1e-30), (qtype, isa, rows)
    exact = x @ w.T
    activation_rounding = (d / 2) @ np.abs(w).T
    assert np.all(np.abs(got - exact) <= activation_rounding + summation + out_rounding + 1e-30)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", SIMPLE)
@pytest.mark.parametrize(
    ("rows", "out_features", "cols"),
    # 512 values and more: the 16-block rounds of the few-row Q4_0/Q4_1 path, with a 2-block tail at 1088;
    # 17 x 70: the many-row path's full and partial 32-column tiles and a 1-row remainder block
    [
        (1, 37, 96),
        (3, 16, 64),
        (4, 9, 320),
        (9, 37, 96),
        (1, 37, 576),
        (2, 5, 512),
        (4, 9, 1088),
        (17, 70, 576),
    ],
)
def test_32_value_formats(qtype: str, isa: str, rows: int, out_features: int, cols: int) -> None:
    check(qtype, isa, rows, out_features, cols, torch.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", list(K_QUANTS))
@pytest.mark.parametrize(("rows", "out_features"), [(1, 37), (2, 5), (7, 21), (18, 70)])
def test_k_quants(qtype: str, isa: str, rows: int, out_features: int) -> None:
    check(qtype, isa, rows, out_features, 512, torch.float32)


# The many-row paths (5+ rows: the file's blocks in 4 x 2 tiles of the portable C reference, on every
# ISA; `isa+x16` the x16 kernels' passes over several activation rows) for every type: row counts that leave
# 1 or 2 rows in the last tile, output rows that are no multiple of a tile (16 rows), and for the 32-value
# formats K / 16 scales per row that are no 8-multiple (K = 96, 160, 288).
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [*SIMPLE, *K_QUANTS])
@pytest.mark.parametrize(("rows", "out_features", "index"), [(5, 17, 0), (7, 33, 1), (8, 16, 2), (12, 47, 3)])
def test_many_rows(qtype: str, isa: str, rows: int, out_features: int, index: int) -> None:
    cols = (256, 512, 768, 1024)[index] if qtype in K_QUANTS else (96, 160, 288, 1024)[index]
    check(qtype, isa, rows, out_features, cols, torch.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [*SIMPLE, *K_QUANTS])
def test_extreme_scales(qtype: str, isa: str) -> None:
    """Blocks from f16 subnormal to near-f16-max scales, activations from 1e-6 to 1e6, at 1, 7 and 13 rows
    (13: AVX-512's x16 form expands 5- and 6-bit codes to bytes once per panel pair)."""
    rng = np.random.default_rng(5)
    values = rng.standard_normal((21, 512)).astype(np.float32)
    values *= np.repeat(rng.choice([1e-7, 1e-3, 1.0, 4e3], size=(21, 16)), 32, axis=1).astype(np.float32)
    raw = K_QUANTS[qtype](values) if qtype in K_QUANTS else quantize(values, GGMLQuantizationType[qtype])
    for rows in (1, 7, 13):
        x = rng.standard_normal((rows, 512)).astype(np.float32)
        x *= np.repeat(rng.choice([1e-6, 1.0, 1e6], size=(rows, 16)), 32, axis=1).astype(np.float32)
        compare(qtype, isa, raw, x, torch.float32)


# Bytes per block and values per block; the offsets of each block's f16 factors (scale, min).
BLOCK = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q5_1": (24, 32), "Q8_0": (34, 32)}
BLOCK |= {"Q2_K": (84, 256), "Q3_K": (110, 256), "Q4_K": (144, 256), "Q5_K": (176, 256), "Q6_K": (210, 256)}
FACTORS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q6_K": [208]}
FACTORS |= {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2]}


def largest_codes(qtype: str, rows: int, cols: int) -> np.ndarray:
    """Blocks whose every code is the type's largest (all bits set; the K-quants' 6-bit scales 63), f16
    factors 1; Q8_0 rows cycle through all -128, all +127 and -128/+127 alternating per 4 values."""
    size, per = BLOCK[qtype]
    raw = np.full((rows, cols // per, size), 0xFF, dtype=np.uint8)
    for at in FACTORS[qtype]:
        raw[..., at : at + 2] = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)
    if qtype == "Q8_0":
        raw[0::3, :, 2:] = 0x80
        raw[1::3, :, 2:] = 0x7F
        raw[2::3, :, 2:] = np.tile(np.repeat(np.array([0x80, 0x7F], dtype=np.uint8), 4), 4)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [*SIMPLE, *K_QUANTS])
def test_largest_products_do_not_saturate(qtype: str, isa: str) -> None:
    """u8 x s8 pair sums are saturating int16 on AVX2 (vpmaddubsw), and the GEMM sums up to 8 of them in
    int16: the largest codes against activations of +-127 (all one sign, or random signs) stay exact."""
    raw = largest_codes(qtype, 19, 512)
    rng = np.random.default_rng(2)
    x = np.ones((13, 512), dtype=np.float32)  # every activation block rounds to +-127 exactly
    x[1::3] = -1.0
    x[2::3] = rng.choice([-1.0, 1.0], size=x[2::3].shape)
    for rows in (1, 4, 7, 13):
        compare(qtype, isa, raw, x[:rows], torch.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q6_K"])
@pytest.mark.parametrize("rows", [1, 6])
def test_bfloat16_activations_and_outputs(qtype: str, isa: str, rows: int) -> None:
    check(qtype, isa, rows, 19, 256, torch.bfloat16)


@pytest.mark.parametrize("qtype", [*SIMPLE, *K_QUANTS])
def test_dequantized_rows_equal_the_gguf_reference(qtype: str) -> None:
    """Embedding lookups: each row exactly as gguf dequantizes it (both compute d * q + m in float32)."""
    if not ISAS:
        pytest.skip("kernels not built")
    raw = weights(qtype, 11, 256, seed=3)
    ops = kernels.load("portable")
    assert ops is not None
    ids = torch.tensor([10, 0, 3, 3])
    got = ops.dequantize_rows(kernels.Segment(qtype, torch.from_numpy(raw)), 256, ids, torch.float32)
    want = dequantize(raw, GGMLQuantizationType[qtype])[ids.numpy()]
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-7, atol=0)


def test_mixed_segments_fill_their_own_output_columns() -> None:
    """A fused q|k|v of a Q4_K_M file mixes types: each segment writes its rows' columns."""
    if not ISAS:
        pytest.skip("kernels not built")
    ops = kernels.load()
    assert ops is not None
    parts = [("Q4_K", 8), ("Q6_K", 5), ("Q4_K", 3)]
    raws = [weights(q, n, 256, seed=i) for i, (q, n) in enumerate(parts)]
    matrix = kernels.BlockMatrix(
        [kernels.Segment(q, torch.from_numpy(r)) for (q, _), r in zip(parts, raws, strict=True)], 256, ops
    )
    x = torch.from_numpy(activations(5, 256, seed=1))
    got = ops.matmul(x, matrix)
    single = [ops.matmul(x, kernels.BlockMatrix([s], 256, ops)) for s in matrix.segments]
    assert torch.equal(got, torch.cat(single, dim=1))


def test_env_forces_an_isa_or_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from localchat.errors import BackendUnavailableError

    monkeypatch.setenv(kernels.KERNELS_ENV, "off")
    assert kernels.load() is None
    if not ISAS:
        return
    monkeypatch.setenv(kernels.KERNELS_ENV, "portable")
    ops = kernels.load()
    assert ops is not None and ops.name == "portable"
    monkeypatch.setenv(kernels.KERNELS_ENV, "sse9")
    with pytest.raises(BackendUnavailableError, match="not an ISA; use one of auto, off, portable"):
        kernels.load()


needs_x16 = pytest.mark.skipif(not X16_ISAS, reason="no AVX2 or AVX-512 VNNI: blocks stay as in the file")


@needs_x16
@pytest.mark.parametrize("qtype", X16_TYPES)
def test_x16_rows_dequantize_exactly_as_the_file_blocks(qtype: str) -> None:
    """Embedding lookups from a repacked table (a tied LM head is repacked): every row, including the
    zero-padded last panel's, equals the GGUF form's bit for bit."""
    raw = weights(qtype, 21, 512, seed=5)  # one full panel and a partial one
    ops = kernels.load(X16_ISAS[-1])
    assert ops is not None
    segment = kernels.Segment(qtype, torch.from_numpy(raw))
    packed = ops.repack(segment, 512)
    assert packed.packed_rows == 21 and packed.rows == 21
    ids = torch.tensor([20, 0, 16, 15, 3, 3])
    got = ops.dequantize_rows(packed, 512, ids, torch.float32)
    assert torch.equal(got, ops.dequantize_rows(segment, 512, ids, torch.float32))


@needs_x16
@pytest.mark.parametrize("isa", X16_ISAS)
def test_x16_mixed_segments_fill_their_own_output_columns(isa: str) -> None:
    """Repacked per segment (panels never span two types), each writes only its rows' columns, however
    its row count falls against the panels of 16: the same output as the GGUF blocks up to float
    summation order."""
    ops = kernels.load(isa)
    assert ops is not None
    parts = [("Q4_K", 20), ("Q6_K", 5), ("Q4_K", 35), ("Q8_0", 17)]
    raws = [weights(q, n, 256, seed=i) for i, (q, n) in enumerate(parts)]
    segments = [kernels.Segment(q, torch.from_numpy(r)) for (q, _), r in zip(parts, raws, strict=True)]
    gguf = kernels.BlockMatrix(segments, 256, ops)
    x16 = kernels.BlockMatrix([ops.repack(s, 256) for s in segments], 256, ops)
    assert all(s.packed_rows for s in x16.segments)
    for rows in (1, 3, 16):
        x = torch.from_numpy(activations(rows, 256, seed=rows))
        want, got = ops.matmul(x, gguf), ops.matmul(x, x16)
        assert got.shape == (rows, 77)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_layout_choice_and_what_is_not_repacked(monkeypatch: pytest.MonkeyPatch) -> None:
    """`LOCALCHAT_KERNEL_LAYOUT`: auto or gguf, anything else refused; the portable kernels and rows that
    do not split into the type's units keep the file's blocks, every block type repacks elsewhere but the
    i-quants (read in place, csrc/lc_iquants.h)."""
    from localchat.errors import BackendUnavailableError

    monkeypatch.setenv(kernels.LAYOUT_ENV, "gguf")
    assert kernels.layout_choice() == "gguf"
    monkeypatch.setenv(kernels.LAYOUT_ENV, "tiles")
    with pytest.raises(BackendUnavailableError, match="auto, gguf"):
        kernels.layout_choice()
    if not ISAS:
        return
    portable = kernels.load("portable")
    assert portable is not None
    q4 = kernels.Segment("Q4_0", torch.from_numpy(weights("Q4_0", 16, 64, seed=1)))
    assert portable.repack(q4, 64) is q4
    for isa in X16_ISAS:
        ops = kernels.load(isa)
        assert ops is not None
        assert all(ops.can_repack(qtype, 256) for qtype in kernels.X16_TYPES)
        assert not any(ops.can_repack(qtype, 256) for qtype in kernels.IQ_TYPES)
        assert not ops.can_repack("Q4_K", 64)  # 64 values: no 256-value unit
        assert ops.repack(q4, 64).packed_rows == 16


@needs_x16
def test_fusing_packed_parts_joins_only_on_whole_panels() -> None:
    """Weights are packed at load straight from the file, before q|k|v or gate|up are fused: parts of one
    type join into one segment only where the first ends on a whole panel (else its padded last panel
    would sit inside the joined rows), and the fused product equals the GGUF blocks' either way."""
    from localchat.backends.torch import quant

    ops = kernels.load(X16_ISAS[-1])
    assert ops is not None
    for sizes, joined in (((32, 16, 16), 1), ((20, 12, 12), 3), ((16, 20, 12), 2)):
        raws = [weights("Q4_K", n, 256, seed=n) for n in sizes]
        parts = [kernels.BlockMatrix([kernels.Segment("Q4_K", torch.from_numpy(r))], 256, ops) for r in raws]
        packed = [kernels.BlockMatrix([ops.repack(p.segments[0], 256)], 256, ops) for p in parts]
        fused, reference = quant.fuse(packed), quant.fuse(parts)
        assert isinstance(fused, kernels.BlockMatrix) and isinstance(reference, kernels.BlockMatrix)
        assert len(fused.segments) == joined and fused.shape == (sum(sizes), 256)
        x = torch.from_numpy(activations(5, 256, seed=2))
        want = ops.matmul(x, reference)
        torch.testing.assert_close(ops.matmul(x, fused), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
