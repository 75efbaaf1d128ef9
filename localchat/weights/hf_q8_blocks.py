"""FP8 (float8_e4m3fn) and int8 checkpoint linears as GGUF Q8_0 blocks (issue #34), so localchat's CPU
kernels run Mistral's / DeepSeek's FP8 repos and compressed-tensors FP8 / W8A8 from 8.5 bits per weight
instead of a bf16 (16) or float32 (32) copy.

Q8_0 is 32 int8 codes q and one fp16 scale d per block: value d q. An e4m3 value with a scale s is
s n 2^k (n = 0..15 the 1.mmm mantissa as an integer, k from the exponent), so a block whose largest
exponent gives K takes d = s 2^(K-3): the largest magnitude lands on 8 n <= 120, every value of the top
four binades (k >= K - 3) on an integer code exactly, and only the smaller ones round, by at most d / 2
(a step of 1/120 of the block's largest value). The one other error is d's own rounding to fp16 (none
where s is an fp16 or bf16 value in fp16's normal range, as compressed-tensors' bf16 scales are;
relative <= 2^-11 for DeepSeek's float32 `weight_scale_inv`), a common factor of the block. int8 W8A8
keeps its codes: d = s per channel, exact where s is an fp16 value. docs/models.md has the measured error.

Scales must be constant over each 32-value block (per tensor, per channel, 128 x 128 blocks, groups of a
multiple of 32); other layouts stay dequantized (the caller's fallback, None here).

`dense_q8` takes a float matrix that an FP8 writer left unquantized beside quantized rows it is fused with
(Qwen3.5's DeltaNet in_proj_b / in_proj_a beside in_proj_qkv / z, Qwen3-Next's in_proj_ba beside qkvz: the
torch kernels' fused in_proj would otherwise be dense as a whole): Q8_0 on the amax / 127 grid per 32
values (each value within half a step, 1/254 of its block's largest; 0.4% RMS on normal weights), exact
float32 values from `dequantize()`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from localchat.weights.hf_quant_blocks import BLOCK, RepackedLinear
from localchat.weights.tensors import WeightTensor

Q8_0_BYTES = 34  # fp16 d + 32 int8
FP8_DTYPE = "HF_Q8"  # no backend reads it as is: `blocks()` on the kernels, else `dequantize()`
_ROWS_PER_CHUNK = 256  # rows converted at once: bounds the float64 temporaries (~2 MiB a row at 4096 in)


def _e4m3fn_table() -> np.ndarray:
    """All 256 float8_e4m3fn values: 4 exponent bits (bias 7), 3 mantissa bits, 0x7f/0xff NaN, no inf."""
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)
    exp, man = (code >> 3) & 0xF, code & 0x7
    normal = (1 + man / 8) * np.exp2(exp - 7.0)
    subnormal = man / 8 * np.exp2(-6.0)
    table = sign * np.where(exp == 0, subnormal, normal)
    table[(code & 0x7F) == 0x7F] = np.nan
    return table.astype(np.float32)


E4M3FN = _e4m3fn_table()
# Each magnitude byte's binade: max(exponent, 1) (subnormals share the lowest normal's grid), 0 for zero.
_BINADE = np.where((np.arange(256) & 0x7F) == 0, 0, np.maximum((np.arange(256) >> 3) & 0xF, 1)).astype(
    np.int32
)


def expand_scale(scale: np.ndarray, reps: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    """A scale tiled over `shape`: scalar, or [R, C] each covering reps[0] x reps[1] values."""
    s = np.asarray(scale, dtype=np.float32)
    if s.size == 1:
        return np.broadcast_to(s.reshape(1, 1), shape)
    rows, cols = shape
    return np.repeat(np.repeat(s, reps[0], axis=0), reps[1], axis=1)[:rows, :cols]


@dataclass(slots=True)
class Q8Linear(RepackedLinear):
    """A linear `[out, in]` kept as its checkpoint's fp8 (uint8) or int8 codes `data` and `scale`
    (tiled by `reps`); `blocks()` converts it to Q8_0 when a backend runs those, `dequantize()` gives the
    checkpoint's exact float32 values (code times scale, as the dense path computes them)."""

    scale: np.ndarray  # float32, scalar or [R, C]
    reps: tuple[int, int]  # values each scale entry covers along out and in

    def blocks(self) -> WeightTensor:
        """The Q8_0 blocks, converted now (row chunks): backends that dequantize never pay for them."""
        rows, cols = self.shape
        out = np.empty((rows, cols // BLOCK * Q8_0_BYTES), np.uint8)
        per_block = self._scale_per_block()
        for start in range(0, rows, _ROWS_PER_CHUNK):
            stop = min(start + _ROWS_PER_CHUNK, rows)
            codes = np.asarray(self.data[start:stop])
            out[start:stop] = _q8_0_rows(codes, per_block[start:stop], codes.dtype == np.uint8)
        return WeightTensor(self.name, self.shape, "Q8_0", out)

    def take_rows(self, rows: np.ndarray) -> Q8Linear:
        """Output rows in `rows`' order (all, or a subset: a split fused matrix); a scale shared by several
        rows becomes one per row."""
        count = self.shape[0]
        scale, reps = self.scale, self.reps
        if scale.size > 1:
            scale = np.ascontiguousarray(np.repeat(scale, reps[0], axis=0)[:count][rows])
            reps = (1, reps[1])
        codes = np.ascontiguousarray(np.asarray(self.data)[rows])
        return replace(self, shape=(len(rows), self.shape[1]), data=codes, scale=scale, reps=reps)

    def dequantize(self) -> np.ndarray:
        codes = np.asarray(self.data)
        values = E4M3FN[codes] if codes.dtype == np.uint8 else codes.astype(np.float32)  # float: itself
        return values * expand_scale(self.scale, self.reps, (self.shape[0], self.shape[1]))

    def _scale_per_block(self) -> np.ndarray:
        """float32 [out, in / 32]: the scale of each 32-value block (constant over it, `q8_linear`)."""
        rows, cols = self.shape
        if self.scale.size == 1:
            return np.full((rows, cols // BLOCK), self.scale.reshape(()), np.float32)
        return expand_scale(self.scale, (self.reps[0], self.reps[1] // BLOCK), (rows, cols // BLOCK))


def q8_linear(name: str, codes: np.ndarray, scale: np.ndarray, reps: tuple[int, int]) -> Q8Linear | None:
    """fp8 bytes (uint8) or int8 codes [out, in] with `scale` tiled by `reps` as a `Q8Linear`, None where
    Q8_0 cannot hold it: the input not whole 32-value blocks, a scale changing inside a block, a NaN
    (float32 values with scale 1: `dense_q8`)."""
    rows, cols = codes.shape
    s = np.asarray(scale, dtype=np.float32)
    if cols % BLOCK or rows == 0 or not np.all(np.isfinite(s)):
        return None
    if s.size == 1:
        s, reps = s.reshape(1, 1), (rows, cols)
    elif s.ndim != 2 or reps[1] % BLOCK or s.shape != (-(-rows // reps[0]), -(-cols // reps[1])):
        return None
    if codes.dtype == np.uint8 and np.any((codes & 0x7F) == 0x7F):
        return None  # e4m3fn NaN codes: nothing to keep
    return Q8Linear(
        name=name,
        shape=(rows, cols),
        dtype=FP8_DTYPE,
        data=codes,
        qtype="Q8_0",
        zeros=np.zeros(0, np.int8),
        order=None,
        scale=s,
        reps=reps,
    )


def dense_q8(name: str, values: np.ndarray) -> Q8Linear | None:
    """A float matrix [out, in] as a `Q8Linear` (see the module docstring), None where Q8_0 cannot hold it."""
    data = np.ascontiguousarray(values, dtype=np.float32)
    if data.ndim != 2 or not np.all(np.isfinite(data)):
        return None
    return q8_linear(name, data, np.float32(1.0), (1, 1))


def _q8_0_rows(codes: np.ndarray, block_scale: np.ndarray, fp8: bool) -> np.ndarray:
    """Q8_0 blocks uint8 [rows, blocks * 34] of codes [rows, cols] whose 32-value blocks have `block_scale`."""
    rows, cols = codes.shape
    blocks = cols // BLOCK
    s = block_scale.astype(np.float64)
    raw = E4M3FN[codes] if fp8 else codes  # float values (`dense_q8`) take the amax / 127 grid below
    values = raw.astype(np.float64).reshape(rows, blocks, BLOCK) * s[..., None]  # exact in float64
    amax = np.abs(values).max(axis=-1)
    full_range = _fp16_step(amax / 127, amax)  # the finest grid that holds the block
    if fp8:
        top = _BINADE[codes & 0x7F].reshape(rows, blocks, BLOCK).max(axis=-1)  # K + 10 per block
        binary = _fp16_step(np.where(top > 0, s * np.exp2(top - 13.0), 0.0), amax)  # s 2^(K - 3)
        q_full, q_binary = _codes(values, full_range), _codes(values, binary)
        err_full = ((q_full * full_range[..., None] - values) ** 2).sum(-1)
        err_binary = ((q_binary * binary[..., None] - values) ** 2).sum(-1)
        pick = err_binary <= err_full  # per block, whichever grid is closer to the fp8 values
        d16 = np.where(pick, binary, full_range).astype(np.float16)
        q = np.where(pick[..., None], q_binary, q_full)
    elif codes.dtype.kind == "f":
        d16 = full_range.astype(np.float16)
        q = _codes(values, full_range)
    else:  # int8 keeps its codes: d = s (exact where s is an fp16 value; a block holding -128 is rescaled)
        d16 = _fp16_step(s, amax).astype(np.float16)
        q = _codes(values, d16.astype(np.float64))
    head = np.ascontiguousarray(d16).view(np.uint8).reshape(rows, blocks, 2)
    return np.concatenate((head, q.astype(np.int8).view(np.uint8)), axis=-1).reshape(rows, -1)


def _codes(values: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Nearest codes of values [rows, blocks, 32] on grids d [rows, blocks] (0: all codes 0), within
    +-127: SIMD dot products that take |q| (sign tricks) misread -128."""
    safe = np.where(d > 0, d, 1.0)
    return np.clip(np.rint(values / safe[..., None]), -127, 127) * (d > 0)[..., None]


def _fp16_step(d: np.ndarray, amax: np.ndarray) -> np.ndarray:
    """d (float64 [rows, blocks]) rounded to fp16, as float64; where that leaves fp16's normal range or
    would not hold the block's amax in int8 (a block whose largest weight is under ~0.0078: fp16 subnormals
    lose bits), amax / 127 rounded up instead."""
    d16 = d.astype(np.float16)
    with np.errstate(over="ignore"):
        bad = (d16 < np.float16(2**-14)) | ~np.isfinite(d16) | (d16.astype(np.float64) * 127.5 < amax)
    bad &= amax > 0
    if np.any(bad):
        up = (amax / 127).astype(np.float16)
        short = up.astype(np.float64) * 127 < amax
        up[short] = np.nextafter(up[short], np.float16(np.inf))
        d16 = np.where(bad, up, d16)
    return np.where(amax > 0, d16, 0).astype(np.float64)
