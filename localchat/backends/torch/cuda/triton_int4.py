"""4-bit weights on CUDA through a Triton kernel of our own (W4A16: 4-bit codes, bf16 activations).

torch's tinygemm kernel (`_weight_int4pack_mm`, quant_cuda.py) is compute-bound from ~32 rows: measured
on an H200, a 2048-row step through Llama-3-8B's gate|up matrix took 16.5 ms against 0.62 ms in bf16
(benchmarks/gpu_int4_bench.py). This kernel decodes the codes to bf16 tiles in registers and multiplies
them on the tensor cores (`tl.dot`): the same step takes 1.8 ms, while every step still reads only the
4-bit form.

Layout (`TritonInt4Weight`, in triton_int4_weight.py, which imports no Triton): `codes` uint8 [out, in / 2], byte
j of a row holding code 2j in its low nibble and code 2j+1 in its high one; `scale` and `zero` bf16
[out, in / 32]; a weight is `(q - 8) * scale + zero`, the same rule (and the same bf16 rounding) as the
tinygemm path, so every GGUF Q4_0/Q4_1 and `--isq q4` matrix maps onto it unchanged.

Few rows (decode) split the reduction over K (`SPLIT_K` programs per output tile, fp32 partial sums
added after, in a fixed order) so even a 4096-row matrix spreads over all the GPU's multiprocessors.
Measured on an H200, one row is still 3-7x slower than tinygemm on an 8B model's smaller matrices, so by
default (quant_cuda.cuda_int4_kernel) this kernel serves only steps of 32 rows and more.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from localchat.backends.torch.cuda.triton_int4_weight import TritonInt4Weight


@triton.jit
def _w4a16_kernel(
    x_ptr,
    codes_ptr,
    scale_ptr,
    zero_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    m_bucket,  # only the autotuner's key: configs are chosen per row-count bucket, not per row count
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FP32_DOT: tl.constexpr = False,  # Triton's interpreter multiplies bf16 tiles wrongly: same values in fp32
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    groups_per_row = K // 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # this program's share of K: whole BLOCK_K tiles, every SPLIT_K-th one
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        byte_idx = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(
            codes_ptr + cols[:, None] * (K // 2) + byte_idx[None, :],
            mask=col_ok[:, None] & (byte_idx[None, :] < K // 2),
            other=0,
        )
        low = (packed & 15).to(tl.float32)
        high = (packed >> 4).to(tl.float32)
        q = tl.reshape(tl.join(low, high), (BLOCK_N, BLOCK_K))  # [.., j, 0|1] -> code 2j, 2j+1
        group_idx = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        g_mask = col_ok[:, None] & (group_idx[None, :] < groups_per_row)
        g_offsets = cols[:, None] * groups_per_row + group_idx[None, :]
        scale = tl.load(scale_ptr + g_offsets, mask=g_mask, other=0.0).to(tl.float32)
        zero = tl.load(zero_ptr + g_offsets, mask=g_mask, other=0.0).to(tl.float32)
        w = tl.reshape(q, (BLOCK_N, BLOCK_K // 32, 32)) - 8.0
        w = w * scale[:, :, None] + zero[:, :, None]
        w = tl.reshape(w, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)
        x = x.to(tl.bfloat16)
        if FP32_DOT:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    # Each K split writes its own slab (few rows: fp32 partials, summed by the caller in a fixed order;
    # atomics would make the sum order, and so greedy tokens, vary from run to run)
    offsets = pid_k * M * N + rows[:, None] * N + cols[None, :]
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _config(bm: int, bn: int, bk: int, split: int, warps: int, stages: int) -> triton.Config:
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split}, num_warps=warps, num_stages=stages
    )


# Few rows: memory-bound, so small output tiles and split K for parallelism; many rows: compute-bound
# tiles for the tensor cores. The autotuner times them once per (row bucket, N, K) at warm-up.
_CONFIGS = [
    _config(16, 32, 256, 1, 4, 4),
    _config(16, 64, 256, 1, 4, 4),
    _config(16, 64, 128, 2, 4, 4),
    _config(16, 32, 256, 4, 4, 4),
    _config(16, 128, 128, 4, 4, 3),
    _config(16, 64, 256, 2, 4, 4),
    _config(16, 128, 256, 1, 8, 3),
    _config(64, 64, 64, 1, 4, 4),
    _config(64, 128, 64, 1, 4, 4),
    _config(128, 128, 64, 1, 8, 3),
    _config(128, 64, 64, 1, 4, 4),
]
MAX_SPLIT_K = max(c.kwargs["SPLIT_K"] for c in _CONFIGS)
_tuned = triton.autotune(
    configs=_CONFIGS,
    key=["m_bucket", "N", "K"],
    prune_configs_by={"early_config_prune": lambda configs, named_args, **kw: _fitting(configs, named_args)},
)(_w4a16_kernel)
# TRITON_INTERPRET (CI): one small config each way; the few-row one splits K to exercise the adds
_INTERPRETED = _config(16, 32, 64, 2, 4, 1)
_INTERPRETED_MANY = _config(32, 32, 64, 1, 4, 1)


def _fitting(configs: list[triton.Config], args: dict[str, object]) -> list[triton.Config]:
    """Few-row configs for few rows and many-row ones otherwise: the wrong half never wins, so skip timing it."""
    few = int(args["m_bucket"]) <= 16  # type: ignore[call-overload]
    chosen = [c for c in configs if (c.kwargs["BLOCK_M"] == 16) == few]
    return chosen or configs


def row_bucket(rows: int) -> int:
    return 16 if rows <= 16 else 64 if rows <= 64 else 256 if rows <= 256 else 4096


def triton_int4_linear(x: torch.Tensor, weight: TritonInt4Weight) -> torch.Tensor:
    """x [T, in] bf16 -> [T, out] bf16."""
    out_features, in_features = weight.shape
    rows = x.shape[0]
    if rows == 0:
        return x.new_empty(0, out_features)
    x = x.contiguous()
    few = rows <= 16  # only few-row configs split K (_fitting), into fp32 partial slabs
    out = (
        torch.empty(MAX_SPLIT_K, rows, out_features, dtype=torch.float32, device=x.device)
        if few
        else torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    )

    def grid(meta: dict[str, int]) -> tuple[int, int, int]:
        return (
            triton.cdiv(rows, meta["BLOCK_M"]),
            triton.cdiv(out_features, meta["BLOCK_N"]),
            meta["SPLIT_K"],
        )

    args = (x, weight.codes, weight.scale, weight.zero, out, rows, out_features, in_features, x.stride(0))
    if os.environ.get("TRITON_INTERPRET") == "1":
        config = _INTERPRETED if few else _INTERPRETED_MANY
        _w4a16_kernel[grid(config.kwargs)](*args, row_bucket(rows), **config.kwargs, FP32_DOT=True)
    else:
        _tuned[grid](*args, row_bucket(rows))
        config = _tuned.best_config
    if not few:
        return out
    split = config.kwargs["SPLIT_K"]
    return (out[0] if split == 1 else out[:split].sum(0)).to(x.dtype)
