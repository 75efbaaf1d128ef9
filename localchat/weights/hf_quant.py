"""Hugging Face quantized safetensors checkpoints (issue #34): GPTQ, AWQ (GEMM packing), FP8
(float8_e4m3fn weights with a per-tensor or block-wise `weight_scale_inv`) and compressed-tensors
(symmetric pack-quantized W4A16, int-quantized W8A8 int8, float-quantized FP8).

config.json's `quantization_config` names the method. Each quantized linear arrives as several tensors
(`qweight`, `qzeros`, `scales`, optional `g_idx`; `weight` + `weight_scale_inv`; `weight_packed` +
`weight_scale`), so the stream is buffered per module until its parts are complete, then dequantized to
float32 (`weight` [out, in]); the backend casts it to its compute dtype. No compact CPU block format is
kept yet: GPTQ/AWQ zero points are per output column over input groups, and fp16 group scales, which
no GGUF block type reproduces bit-exactly (Q4_0 stores one fp16 scale per 32 and no zero).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.tensors import WeightTensor

log = logging.getLogger(__name__)

# Storage dtypes quantized checkpoints add to F32/F16/BF16: packed int32 codes, fp8 bytes, int8.
QUANT_STORAGE = {"I32": np.int32, "F8_E4M3": np.uint8, "I8": np.int8, "I64": np.int64}
METHODS = ("gptq", "awq", "fp8", "compressed-tensors")
# compressed-tensors parts; activation scales (W8A8 static input_scale) are dropped: we compute in bf16/f32.
_CT_PARTS = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "input_scale")
_GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")
# AutoAWQ's GEMM layout puts output column ORDER[i] in nibble i of each int32; UNDO inverts it.
_AWQ_UNDO = np.array([0, 4, 1, 5, 2, 6, 3, 7])


def quant_method(raw_config: dict[str, Any]) -> str | None:
    """The folder's quantization method, None for a dense checkpoint; unknown methods are refused."""
    qc = raw_config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "mxfp4":  # gpt-oss experts: read by the family's own sanitize (weights/mxfp4.py)
        return None
    if method not in METHODS:
        raise ModelLoadError(
            f"quantization_config.quant_method {method!r} is not supported; localchat reads "
            f"{', '.join(METHODS)} safetensors checkpoints (or use a GGUF file)."
        )
    if method == "compressed-tensors":
        for group in (qc.get("config_groups") or {}).values():
            weights = (group or {}).get("weights") or {}
            if not weights.get("symmetric", True):
                raise ModelLoadError(
                    "compressed-tensors with asymmetric weights (zero points) is not supported."
                )
            if weights.get("type", "int") == "int" and int(weights.get("num_bits", 8)) not in (4, 8):
                raise ModelLoadError(
                    f"compressed-tensors {weights.get('num_bits')}-bit ints are not supported."
                )
        return method
    bits = int(qc.get("bits", 4 if method != "fp8" else 8))
    if method in ("gptq", "awq") and bits != 4:
        raise ModelLoadError(f"{method.upper()} with {bits} bits is not supported; only 4-bit.")
    if method == "awq" and str(qc.get("version", "gemm")).lower() != "gemm":
        raise ModelLoadError(f"AWQ version {qc.get('version')!r} is not supported; only the GEMM packing.")
    return method


def unpack_int4(packed: np.ndarray, axis: int) -> np.ndarray:
    """int32 words holding eight 4-bit codes, lowest nibble first, spread along `axis` (0 or 1)."""
    words = np.asarray(packed).view(np.uint32)
    nibbles = np.stack([(words >> (4 * i)) & 0xF for i in range(8)], axis=axis + 1)
    shape = list(words.shape)
    shape[axis] *= 8
    return nibbles.reshape(shape).astype(np.int32)


def dequantize_gptq(
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray | None,
    group_size: int,
    zero_offset: int,
) -> np.ndarray:
    """GPTQ: qweight [in/8, out] packed along in, qzeros [groups, out/8] packed along out, scales
    [groups, out]. v1 checkpoints store zero - 1 (`zero_offset` 1). Returns float32 [out, in]."""
    codes = unpack_int4(qweight, axis=0)  # [in, out]
    zeros = unpack_int4(qzeros, axis=1) + zero_offset  # [groups, out]
    n_in = codes.shape[0]
    groups = np.arange(n_in) // group_size if g_idx is None else np.asarray(g_idx, dtype=np.int64)
    s = np.asarray(scales, dtype=np.float32)
    w = (codes - zeros[groups]).astype(np.float32) * s[groups]
    return np.ascontiguousarray(w.T)


def dequantize_awq(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int
) -> np.ndarray:
    """AWQ GEMM: qweight [in, out/8] and qzeros [groups, out/8] packed along out in AWQ's interleaved
    nibble order, zeros stored as is. Returns float32 [out, in]."""

    def columns(packed: np.ndarray) -> np.ndarray:
        codes = unpack_int4(packed, axis=1)
        rows, cols = codes.shape
        return codes.reshape(rows, cols // 8, 8)[:, :, _AWQ_UNDO].reshape(rows, cols)

    codes, zeros = columns(qweight), columns(qzeros)
    groups = np.arange(codes.shape[0]) // group_size
    w = (codes - zeros[groups]).astype(np.float32) * np.asarray(scales, dtype=np.float32)[groups]
    return np.ascontiguousarray(w.T)


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


def dequantize_fp8(
    weight: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = (128, 128)
) -> np.ndarray:
    """fp8 bytes [out, in] times `weight_scale_inv`: a scalar or one value per `block`
    (config weight_block_size, DeepSeek's 128x128). Returns float32 [out, in]."""
    w = E4M3FN[np.asarray(weight, dtype=np.uint8)]
    s = np.asarray(scale_inv, dtype=np.float32)
    if s.size == 1:
        return w * s.reshape(())
    rows, cols = w.shape
    bo, bi = block
    if s.shape != (-(-rows // bo), -(-cols // bi)):
        raise ModelLoadError(f"FP8 scales {s.shape} do not tile a {rows}x{cols} weight in {bo}x{bi} blocks.")
    return w * np.repeat(np.repeat(s, bo, axis=0), bi, axis=1)[:rows, :cols]


def unpack_ct(packed: np.ndarray, shape: tuple[int, int], bits: int) -> np.ndarray:
    """compressed-tensors pack-quantized: 32/bits signed codes per int32 along the input, lowest bits first,
    each stored plus 2^(bits-1). Returns int32 codes [out, in]."""
    words = np.asarray(packed).view(np.uint32)
    per, mask = 32 // bits, (1 << bits) - 1
    codes = np.stack([(words >> (bits * i)) & mask for i in range(per)], axis=2).reshape(words.shape[0], -1)
    return codes[:, : shape[1]].astype(np.int32) - (1 << (bits - 1))


def scale_weight(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """values [out, in] times a compressed-tensors scale: scalar (tensor), [out, 1] (channel),
    [out, in/g] (group) or [out/b, in/b] (block)."""
    s = np.asarray(scale, dtype=np.float32)
    rows, cols = values.shape
    if s.size == 1:
        return values * s.reshape(())
    reps_r, reps_c = -(-rows // s.shape[0]), -(-cols // s.shape[1])
    return values * np.repeat(np.repeat(s, reps_r, axis=0), reps_c, axis=1)[:rows, :cols]


def _ct_weight(parts: dict[str, np.ndarray], bits: int) -> np.ndarray:
    if "weight_packed" in parts:
        shape = tuple(int(d) for d in parts["weight_shape"])
        codes = unpack_ct(parts["weight_packed"], (shape[0], shape[1]), bits)
        return scale_weight(codes.astype(np.float32), parts["weight_scale"])
    raw = parts["weight"]
    values = E4M3FN[raw.view(np.uint8)] if raw.dtype == np.uint8 else raw.astype(np.float32)
    return scale_weight(values, parts["weight_scale"])


def _ct_bits(qconfig: dict[str, Any]) -> int:
    for group in (qconfig.get("config_groups") or {}).values():
        return int(((group or {}).get("weights") or {}).get("num_bits", 4))
    return 4


def dequantized_stream(
    tensors: Iterator[WeightTensor], method: str, qconfig: dict[str, Any]
) -> Iterator[WeightTensor]:
    """The checkpoint's tensors with every quantized linear replaced by its float32 `weight`."""
    group = int(qconfig.get("group_size", 128))
    group = group if group > 0 else 1 << 30  # -1: one group over the whole input
    # gptq_v2 stores zeros as is; v1 ("gptq", the default) stores zero - 1.
    offset = 0 if str(qconfig.get("checkpoint_format", "gptq")) == "gptq_v2" else 1
    bo, bi = (int(v) for v in qconfig.get("weight_block_size") or (128, 128))
    pending: dict[str, dict[str, np.ndarray]] = {}
    done: set[str] = set()  # compressed-tensors modules already yielded: later scales are dropped
    log.info(
        "%s checkpoint: quantized linears are dequantized at load (float32, then the compute dtype)", method
    )
    for t in tensors:
        module, _, part = t.name.rpartition(".")
        if method == "compressed-tensors" and (
            part in _CT_PARTS or (part == "weight" and t.dtype in QUANT_STORAGE)
        ):
            parts = pending.setdefault(module, {})
            parts[part] = np.asarray(t.data) if t.dtype in QUANT_STORAGE else t.dequantize()
            if "weight_scale" in parts and (
                "weight" in parts or {"weight_packed", "weight_shape"} <= parts.keys()
            ):
                done.add(module)
                yield _dense(module, _ct_weight(parts, _ct_bits(qconfig)))
                parts.clear()
            continue
        if method == "fp8" and (part == "weight_scale_inv" or (part == "weight" and t.dtype == "F8_E4M3")):
            parts = pending.setdefault(module, {})
            parts[part] = t.dequantize() if part == "weight_scale_inv" else np.asarray(t.data)
            if len(parts) == 2:
                del pending[module]
                yield _dense(module, dequantize_fp8(parts["weight"], parts["weight_scale_inv"], (bo, bi)))
            continue
        if method in ("gptq", "awq") and part in _GPTQ_PARTS:
            parts = pending.setdefault(module, {})
            parts[part] = np.asarray(t.data) if t.dtype == "I32" else t.dequantize()
            if {"qweight", "qzeros", "scales"} <= parts.keys() and ("g_idx" in parts or method == "awq"):
                del pending[module]
                yield _dense(module, _gptq_or_awq(method, parts, group, offset))
            continue
        if t.dtype in QUANT_STORAGE:
            raise ModelLoadError(f"Tensor {t.name} ({t.dtype}) is not part of a {method} linear layer.")
        yield t
    for module, parts in pending.items():
        if method == "compressed-tensors" and (module in done or set(parts) <= {"input_scale"}):
            continue  # activation scales (W8A8) of an already yielded or unquantized layer: unused
        elif method == "gptq" and {"qweight", "qzeros", "scales"} <= parts.keys():  # no g_idx saved
            yield _dense(module, _gptq_or_awq(method, parts, group, offset))
        else:
            raise ModelLoadError(f"Quantized layer {module} lacks {sorted(parts)} counterpart tensors.")


def _gptq_or_awq(method: str, parts: dict[str, np.ndarray], group: int, offset: int) -> np.ndarray:
    if method == "awq":
        return dequantize_awq(parts["qweight"], parts["qzeros"], parts["scales"], group)
    g_idx = parts.get("g_idx")
    return dequantize_gptq(
        parts["qweight"],
        parts["qzeros"],
        parts["scales"],
        None if g_idx is None else g_idx.astype(np.int64),
        group,
        offset,
    )


def _dense(module: str, values: np.ndarray) -> WeightTensor:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return WeightTensor(name=f"{module}.weight", shape=tuple(values.shape), dtype="F32", data=values)


# Values per stored element of a quantized weight part; the other parts (zeros, scales, g_idx) vanish at load.
_EXPANSION = {"qweight": 8, "weight_packed": 0, "weight": 1}


def loaded_weight_bytes(headers: list[dict[str, Any]], value_bytes: int, bits: int = 4) -> int:
    """Bytes the weights take once dequantized (`value_bytes` per value), from safetensors headers:
    what the pre-load RAM check counts for a quantized folder instead of its (4x-8x smaller) file size."""
    total = 0
    for header in headers:
        for name, info in header.items():
            part = name.rpartition(".")[2]
            begin, end = info["data_offsets"]
            count = int(np.prod([int(d) for d in info["shape"]], dtype=np.int64))
            if info["dtype"] not in QUANT_STORAGE:
                total += 0 if part in _CT_PARTS or part == "weight_scale_inv" else int(end) - int(begin)
            elif part in _EXPANSION:
                total += count * (_EXPANSION[part] or 32 // bits) * value_bytes
    return total
