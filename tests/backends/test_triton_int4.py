"""The Triton 4-bit matmul (CUDA's W4A16 path), run by Triton's interpreter on CPU tensors against the
float64 product of the same dequantized weights: the nibble order, the group scales and zeros, masking of
ragged row/column/K tiles and the split-K sums are all checked here; speed needs a GPU
(benchmarks/gpu_int4_bench.py)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton decorates the kernels

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from localchat.backends.torch.cuda.quant_cuda import dequantize_q4, pack_triton, quantize_q4  # noqa: E402
from localchat.backends.torch.cuda.triton_int4 import row_bucket, triton_int4_linear  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter (set before import)"
)
CPU = torch.device("cpu")


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("shape", [(64, 128), (45, 96), (33, 160)], ids=["tiles", "ragged-k", "ragged-n"])
def test_matches_the_dequantized_product(rows: int, shape: tuple[int, int]) -> None:
    out_features, in_features = shape
    gen = torch.Generator().manual_seed(rows * 1000 + out_features)
    dense = (
        torch.randn(out_features, in_features, generator=gen) * torch.logspace(-3, 1, out_features)[:, None]
    )
    codes, scale, zero = quantize_q4(dense)
    weight = pack_triton(codes, scale, zero, CPU)
    x = torch.randn(rows, in_features, generator=gen).bfloat16()
    got = triton_int4_linear(x, weight)
    expected = x.double() @ dequantize_q4(codes, scale, zero).double().t()
    assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
    # the kernel rounds each dequantized weight to bf16 (unit roundoff 2^-8) before the tensor-core
    # product, sums in fp32 and rounds the result to bf16 (2^-8 of |result| <= sum |x||w|)
    bound = 2**-7 * (x.double().abs() @ dequantize_q4(codes, scale, zero).double().abs().t()) + 1e-6
    assert bool(((got.double() - expected).abs() <= bound).all()), float(
        ((got.double() - expected).abs() / bound).max()
    )


def test_codes_keep_their_order_and_zero_rows_are_no_launch() -> None:
    """One weight per column set to a distinct code: swapping the nibbles or the groups would move it."""
    codes = (torch.arange(64 * 64) % 16).reshape(64, 64).to(torch.uint8)
    scale = torch.full((64, 2), 0.5)
    zero = torch.arange(128, dtype=torch.float32).reshape(64, 2) / 16
    weight = pack_triton(codes, scale, zero, CPU)
    eye = torch.eye(64).bfloat16()  # row i picks input column i: the output is the weight matrix itself
    got = triton_int4_linear(eye, weight).float().t()
    torch.testing.assert_close(got, dequantize_q4(codes, scale, zero).bfloat16().float())
    assert triton_int4_linear(torch.zeros(0, 64).bfloat16(), weight).shape == (0, 64)


def test_row_buckets_are_few_then_many() -> None:
    assert [row_bucket(r) for r in (1, 16, 17, 64, 65, 256, 257, 4096)] == [
        16,
        16,
        64,
        64,
        256,
        256,
        4096,
        4096,
    ]


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_gguf_blocks_load_into_the_triton_form_and_match_their_values(qtype: str) -> None:
    """The CUDA load path (policy.cuda, Triton kernel) on CPU tensors: GGUF scale/min -> scale/zero."""
    from localchat.backends.torch.cuda.triton_int4_weight import TritonInt4Weight
    from localchat.backends.torch.quant import QuantPolicy, convert, finalize, linear
    from tests.backends.test_torch_quant import random_blocks

    weight = random_blocks(qtype, rows=48, cols=256)
    policy = QuantPolicy(int4=True, cuda=True, cuda_kernel="triton")
    packed = finalize(convert(weight, torch.bfloat16, CPU, policy), torch.bfloat16, CPU, policy)
    assert isinstance(packed, TritonInt4Weight) and packed.shape == (48, 256)
    dense = torch.from_numpy(weight.dequantize()).reshape(48, 256).double()
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    got = linear(x, packed).double()
    expected = x.double() @ dense.t()
    # scale and zero are kept in bf16 (2^-8 of each group's magnitude), each weight and the output rounded
    bound = 2**-6 * (x.double().abs() @ dense.abs().t()) + 1e-6
    assert bool(((got - expected).abs() <= bound).all())


def test_the_cuda_int4_forms_follow_the_env_and_the_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from localchat.backends.torch.cuda.quant_cuda import CUDA_INT4_ENV, cuda_int4_kernel
    from localchat.errors import BackendUnavailableError

    gib = 2**30
    monkeypatch.delenv(CUDA_INT4_ENV, raising=False)
    assert cuda_int4_kernel(5 * gib, 140 * gib) == "both"  # an 8B Q4 model on an H200: both forms fit
    assert cuda_int4_kernel(5 * gib, 20 * gib) == "both"  # exactly half the free memory
    assert cuda_int4_kernel(5 * gib, 19 * gib) == "tinygemm"  # an 8 GB card's worth: one form
    monkeypatch.setenv(CUDA_INT4_ENV, "triton")
    assert cuda_int4_kernel(5 * gib, 6 * gib) == "triton"  # asked for: no memory rule
    monkeypatch.setenv(CUDA_INT4_ENV, "tinygemm")
    assert cuda_int4_kernel(1, 140 * gib) == "tinygemm"
    monkeypatch.setenv(CUDA_INT4_ENV, "marlin")
    with pytest.raises(BackendUnavailableError, match="both, triton, tinygemm"):
        cuda_int4_kernel(1, None)


def test_both_forms_route_many_rows_to_triton_and_few_to_tinygemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygemm runs only on CUDA: here its op is the boundary, replaced by a recorder."""
    from localchat.backends.torch.cuda import quant_cuda
    from localchat.backends.torch.quant import linear

    codes = torch.randint(0, 16, (64, 128), dtype=torch.uint8)
    scale, zero = torch.rand(64, 4) / 10, torch.randn(64, 4) / 10
    weight = quant_cuda.Int4CudaWeight(
        torch.empty(0), torch.empty(0), 64, 128, pack_triton(codes, scale, zero, CPU)
    )
    calls: list[int] = []

    def tinygemm(x: torch.Tensor, *_: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return x.new_zeros(x.shape[0], 64)

    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm", tinygemm, raising=False)
    dense = dequantize_q4(codes, scale, zero)
    for rows in (1, quant_cuda.TRITON_FROM_ROWS - 1, quant_cuda.TRITON_FROM_ROWS, 100):
        x = torch.randn(rows, 128).bfloat16()
        got = linear(x, weight)
        if rows < quant_cuda.TRITON_FROM_ROWS:
            assert calls[-1] == rows and got.abs().sum() == 0
        else:
            torch.testing.assert_close(got.float(), x.float() @ dense.t(), atol=0.05, rtol=0.02)
    assert calls == [1, quant_cuda.TRITON_FROM_ROWS - 1]
    weight.many_rows = None  # tinygemm alone: every step goes to it
    linear(torch.randn(100, 128).bfloat16(), weight)
    assert calls[-1] == 100


def test_split_k_partials_are_summed_in_a_fixed_order() -> None:
    """The few-row path's K splits land in separate slabs: two runs are bitwise equal."""
    codes, scale, zero = quantize_q4(torch.randn(96, 256))
    weight = pack_triton(codes, scale, zero, CPU)
    x = torch.randn(3, 256).bfloat16()
    assert torch.equal(triton_int4_linear(x, weight), triton_int4_linear(x, weight))
