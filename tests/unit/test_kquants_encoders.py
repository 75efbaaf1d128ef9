"""The test-side Q2_K/Q3_K encoders (tests/helpers/kquants.py) against the `gguf` package's decoder:
values built on each format's exact grid come back bit for bit (so every scale, min and code lands in
the byte the format defines), and arbitrary values come back within the format's usual error."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tests.helpers import kquants


def test_q2_k_grid_values_round_trip_exactly() -> None:
    rng = np.random.default_rng(0)
    blocks = 6
    sc = rng.integers(1, 16, (blocks, 16))
    m = rng.integers(0, 16, (blocks, 16))
    sc[:, 0], m[:, 0] = 15, 15  # d = 1 and dmin = 0.5 exactly
    q = rng.integers(0, 4, (blocks, 16, 16))
    q[..., 0], q[..., 1] = 0, 3  # every group spans its full range: the encoder recovers sc and m
    x = (sc[..., None] * q - 0.5 * m[..., None]).astype(np.float32).reshape(2, -1)
    y = dequantize(kquants.quantize_q2_k(x), GGMLQuantizationType.Q2_K)
    np.testing.assert_array_equal(y, x)


def test_q3_k_grid_values_round_trip_exactly() -> None:
    rng = np.random.default_rng(1)
    blocks = 6
    s = rng.integers(1, 32, (blocks, 16))
    s[:, 0] = 31  # d = 1 exactly
    q = rng.integers(-4, 4, (blocks, 16, 16))
    q[..., 0] = -4  # |q| = 4 in every group: the encoder recovers s
    x = (s[..., None] * q).astype(np.float32).reshape(3, -1)
    y = dequantize(kquants.quantize_q3_k(x), GGMLQuantizationType.Q3_K)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize(("qtype", "limit"), [("Q2_K", 0.4), ("Q3_K", 0.25), ("Q4_K", 0.12), ("Q6_K", 0.04)])
def test_gaussian_values_come_back_within_the_formats_error(qtype: str, limit: float) -> None:
    x = np.random.default_rng(2).standard_normal((4, 1024)).astype(np.float32)
    y = dequantize(kquants.K_QUANTIZERS[qtype](x), GGMLQuantizationType[qtype])
    assert np.sqrt(((y - x) ** 2).mean()) / np.sqrt((x**2).mean()) < limit
