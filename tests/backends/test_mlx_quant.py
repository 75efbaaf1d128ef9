"""GGUF Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 / Q4_K / Q5_K blocks map onto MLX affine group quantization
exactly; Q6_K is re-quantized to 8 bits within a stated bound.

The reference is the `gguf` package's own dequantizer on the same raw blocks. Blocks are random bytes
(every nibble / int8 value occurs) with random finite float16 scales of both signs, including tiny
(subnormal) and large ones. `mx.dequantize` of the converted arrays must equal it value for value in
float32. The only bit pattern that differs is the sign of zero: GGUF's Q4_0 computes d * (q - 8),
which is -0.0 for q = 8 and d < 0, where MLX's d * q + (-8 d) gives +0.0 (equal values).
"""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from localchat.backends.mlx.quant import (  # noqa: E402
    DenseWeight,
    QuantizedWeight,
    concat_rows,
    gguf_blocks_to_affine,
    linear,
    take_rows,
    to_weight,
)
from localchat.weights.tensors import WeightTensor  # noqa: E402

pytestmark = pytest.mark.mlx

ROWS, COLS = 48, 192  # 6 blocks per row


def random_blocks(qtype: str, seed: int = 0) -> np.ndarray:
    """uint8 [ROWS, bytes_per_row] of valid GGUF blocks: random payload, finite float16 d (and m)."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    blocks = rng.integers(0, 256, size=(ROWS, COLS // block, nbytes), dtype=np.uint8)
    num_halves = 2 if qtype == "Q4_1" else 1
    magnitude = 10.0 ** rng.uniform(-7, 2, size=(ROWS, COLS // block, num_halves))  # subnormal .. 100
    halves = (magnitude * rng.choice([-1.0, 1.0], size=magnitude.shape)).astype(np.float16)
    halves[0, 0] = 0.0  # a zero scale too
    blocks[..., : 2 * num_halves] = halves.view(np.uint8).reshape(ROWS, COLS // block, 2 * num_halves)
    return blocks.reshape(ROWS, -1)


@pytest.mark.parametrize(("qtype", "bits"), [("Q4_0", 4), ("Q4_1", 4), ("Q8_0", 8)])
def test_mapping_is_exact(qtype: str, bits: int) -> None:
    blocks = random_blocks(qtype)
    expected = dequantize(blocks, GGMLQuantizationType[qtype]).astype(np.float32)  # [ROWS, COLS]
    packed, scales, biases, got_bits = gguf_blocks_to_affine(qtype, blocks)
    assert got_bits == bits
    assert packed.dtype == np.uint32 and packed.shape == (ROWS, COLS * bits // 32)
    assert scales.shape == biases.shape == (ROWS, COLS // 32)
    ours = np.array(
        mx.dequantize(mx.array(packed), mx.array(scales), mx.array(biases), group_size=32, bits=bits)
    )
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, expected)  # value-exact (-0.0 == 0.0)
    differing_bits = ours.view(np.uint32) != expected.view(np.uint32)
    assert (expected[differing_bits] == 0).all()  # only the sign of zero may differ


def test_packing_agrees_with_mx_quantize() -> None:
    """Integer-valued groups spanning 0..15 go through mx.quantize losslessly: our packing of the same
    4-bit codes (as Q4_1 blocks with d = 1, m = 0) must produce mx.quantize's very words."""
    rng = np.random.default_rng(1)
    values = rng.integers(0, 16, size=(4, 64)).astype(np.float32)
    values[:, ::32], values[:, 1::32] = 0, 15  # every group spans the full range
    packed, scales, biases = mx.quantize(mx.array(values), group_size=32, bits=4)
    scale = np.repeat(np.array(scales), 32, axis=1)
    bias = np.repeat(np.array(biases), 32, axis=1)
    codes = np.round((values - bias) / scale).astype(np.uint8).reshape(4, 2, 32)  # MLX's stored codes
    # GGUF order: code j in the low nibble of byte j, code j + 16 in its high nibble.
    nibbles = codes[..., :16] | (codes[..., 16:] << 4)
    header = np.array([1.0, 0.0], dtype=np.float16).view(np.uint8)
    blocks = np.concatenate([np.broadcast_to(header, (4, 2, 4)), nibbles], axis=-1).reshape(4, -1)
    ours, _, _, _ = gguf_blocks_to_affine("Q4_1", np.ascontiguousarray(blocks))
    np.testing.assert_array_equal(ours, np.array(packed))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_quantized_weight_matmul_and_lookup(qtype: str) -> None:
    blocks = random_blocks(qtype, seed=2)
    dense = dequantize(blocks, GGMLQuantizationType[qtype]).astype(np.float32)
    weight = to_weight(WeightTensor("w", (ROWS, COLS), qtype, blocks), mx.float32)
    assert isinstance(weight, QuantizedWeight) and weight.shape == (ROWS, COLS)
    x = np.random.default_rng(3).standard_normal((5, COLS)).astype(np.float32) * 1e-2
    got = np.array(linear(mx.array(x), weight))
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-4, atol=1e-4 * np.abs(dense).max())
    # Wide steps on CPU take the transient dense path: the same product.
    wide = to_weight(WeightTensor("w", (ROWS, COLS), qtype, blocks), mx.float32, dense_from_rows=4)
    assert isinstance(wide, QuantizedWeight) and wide.dense_from_rows == 4
    np.testing.assert_allclose(np.array(linear(mx.array(x), wide)), got, rtol=1e-4, atol=1e-6)
    ids = mx.array([3, 0, 47, 3])
    np.testing.assert_array_equal(np.array(take_rows(weight, ids)), dense[[3, 0, 47, 3]])


def k_blocks(qtype: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random payload with finite float16 headers of both signs (d, and dmin / m where the type has it)."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    blocks = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)
    halves = 2 if qtype in ("Q5_1", "Q4_K", "Q5_K", "Q2_K") else 1
    at = nbytes - 2 if qtype == "Q6_K" else 0  # Q6_K keeps d at the end of its block
    values = 10.0 ** rng.uniform(-6, 1, size=(rows, cols // block, halves))
    values *= rng.choice([-1.0, 1.0], size=values.shape)
    header = values.astype(np.float16).view(np.uint8).reshape(rows, cols // block, 2 * halves)
    blocks[..., at : at + 2 * halves] = header
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize(("qtype", "bits"), [("Q5_0", 5), ("Q5_1", 5), ("Q4_K", 4), ("Q5_K", 5)])
def test_more_types_map_exactly(qtype: str, bits: int) -> None:
    """Every code, 6-bit sub-block scale / min and high bit occurs in random blocks: value-exact."""
    rows, cols = 16, 512
    blocks = k_blocks(qtype, rows, cols, seed=7)
    expected = dequantize(blocks, GGMLQuantizationType[qtype]).astype(np.float32)
    weight = to_weight(WeightTensor("w", (rows, cols), qtype, blocks), mx.float32)
    assert isinstance(weight, QuantizedWeight) and (weight.bits, weight.group_size) == (bits, 32)
    assert weight.shape == (rows, cols)
    ours = np.array(take_rows(weight, mx.arange(rows)))
    np.testing.assert_array_equal(ours, expected)  # -0.0 == 0.0
    x = np.random.default_rng(8).standard_normal((3, cols)).astype(np.float32)
    got = np.array(linear(mx.array(x), weight))
    np.testing.assert_allclose(got, x @ expected.T, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize(("qtype", "bits"), [("Q6_K", 8), ("Q3_K", 5), ("Q2_K", 4)])
def test_16_value_k_quants_are_requantized_within_half_a_step(qtype: str, bits: int) -> None:
    """No group-32 form exists for 16-value sub-blocks: min/max groups of 32 over the dequantized values,
    each value within half a step of its group's range (Q6_K: 8 bits, a quarter of its own step; Q3_K:
    5 bits; Q2_K: 4)."""
    from tests.helpers.kquants import K_QUANTIZERS

    rows, cols = 8, 512
    values = np.random.default_rng(9).standard_normal((rows, cols)).astype(np.float32)
    blocks = K_QUANTIZERS[qtype](values).reshape(rows, -1)
    reference = dequantize(blocks, GGMLQuantizationType[qtype]).astype(np.float32)
    weight = to_weight(WeightTensor("w", (rows, cols), qtype, blocks), mx.float32)
    assert isinstance(weight, QuantizedWeight) and (weight.bits, weight.group_size) == (bits, 32)
    ours = np.array(take_rows(weight, mx.arange(rows)))
    groups = reference.reshape(rows, -1, 32)
    half_step = (groups.max(-1) - groups.min(-1)) / (2**bits - 1) / 2  # [rows, groups]
    error = np.abs(ours - reference).reshape(rows, -1, 32).max(-1)
    assert (error <= half_step * 1.01 + 1e-7).all()
    assert error.max() > 0  # really re-quantized, not a dense copy
    x = np.random.default_rng(10).standard_normal((3, cols)).astype(np.float32)
    got = np.array(linear(mx.array(x), weight))
    np.testing.assert_allclose(got, x @ ours.T, rtol=1e-4, atol=1e-4 * np.abs(ours).max())


def test_mxfp4_keeps_its_mlx_form_and_float_weights_are_dense() -> None:
    """Float weights are dense. MXFP4 (no affine form) keeps MLX's mxfp4 mode, every value the file's
    (tests/backends/test_mlx_moe_quant.py); the i-quants are re-quantized (test_mlx_iquants.py)."""
    rng = np.random.default_rng(4)
    values = rng.standard_normal((8, 256)).astype(np.float32)
    blocks = rng.integers(0, 256, size=(8, 8, 17), dtype=np.uint8)  # 8 blocks of 32: e8m0, 16 bytes of codes
    blocks[..., 0] = 126  # scale 2^-2 (as ggml reads it)
    blocks = blocks.reshape(8, -1)
    weight = to_weight(WeightTensor("w", (8, 256), "MXFP4", blocks), mx.float32)
    assert isinstance(weight, QuantizedWeight) and weight.mode == "mxfp4" and weight.shape == (8, 256)
    np.testing.assert_array_equal(
        np.array(weight.dequantized()), dequantize(blocks, GGMLQuantizationType.MXFP4)
    )
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    dense = to_weight(WeightTensor("w", (8, 256), "BF16", bf16), mx.float32)
    assert isinstance(dense, DenseWeight)
    np.testing.assert_array_equal(np.array(dense.wt).T, (bf16.astype(np.uint32) << 16).view(np.float32))
    x = rng.standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_allclose(
        np.array(linear(mx.array(x), dense)), x @ np.array(dense.wt), rtol=1e-5, atol=1e-5
    )


def test_fusing_needs_one_format() -> None:
    q4 = to_weight(WeightTensor("a", (ROWS, COLS), "Q4_0", random_blocks("Q4_0")), mx.float32)
    q4b = to_weight(WeightTensor("b", (ROWS, COLS), "Q4_1", random_blocks("Q4_1")), mx.float32)
    q8 = to_weight(WeightTensor("c", (ROWS, COLS), "Q8_0", random_blocks("Q8_0")), mx.float32)
    fused = concat_rows([q4, q4b])
    assert isinstance(fused, QuantizedWeight) and fused.shape == (2 * ROWS, COLS)
    assert concat_rows([q4, q8]) is None  # 4-bit and 8-bit rows cannot share one matrix
    dense = DenseWeight(mx.zeros((COLS, ROWS)))
    assert concat_rows([q4, dense]) is None
    both = concat_rows([dense, DenseWeight(mx.ones((COLS, 8)))])
    assert isinstance(both, DenseWeight) and both.shape == (ROWS + 8, COLS)
