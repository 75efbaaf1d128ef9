"""Hugging Face quantized safetensors checkpoints (issue #34): GPTQ, AWQ (GEMM packing), FP8
(float8_e4m3fn weights with a per-tensor or block-wise `weight_scale_inv`, or AutoFP8's per-tensor
`weight_scale`, the same multiplier: hf_quant_fp8.py, which also drops activation / KV scales) and compressed-tensors
(symmetric pack-quantized W4A16, int-quantized W8A8 int8, float-quantized FP8).

config.json's `quantization_config` names the method. Each quantized linear arrives as several tensors
(`qweight`, `qzeros`, `scales`, optional `g_idx`; `weight` + `weight_scale_inv`; `weight_packed` +
`weight_scale`), so the stream is buffered per module until its parts are complete.

4-bit GPTQ, AWQ and compressed-tensors W4A16 linears whose groups are whole 32-value blocks (group size
a multiple of 32, or one group per row) are handed over compact (`RepackedLinear`, hf_quant_blocks.py):
GGUF blocks that localchat's CPU kernels run. GPTQ/AWQ's w = s (q - z) (fp16 s, integer z per group and
output) becomes Q4_1's d q + m with d = s exactly and m = -s z rounded once to fp16: each value moves by
at most half an fp16 ulp of s z (s z itself is exact in float32: 11 x 4 significant bits). Symmetric
compressed-tensors (w = s q, q in -8..7) is Q4_0 bit for bit: d = s, stored code q + 8. GPTQ act-order
(`g_idx` not sorted) keeps its groups by reordering the input columns once here (`order`); the backend
reorders the activations the same way (one index_select per matmul). A backend that does not run the
blocks (no kernels, CUDA, MPS) calls `dequantize()`: the exact float32 values, as before.
FP8 (`quant_method: fp8`, per tensor or per block) and compressed-tensors 8-bit layer linears (FP8, int8
W8A8) whose scales hold over 32 values are handed over as `Q8Linear` (hf_q8_blocks.py): Q8_0 blocks made
when a backend asks for them (the CPU kernels; MLX as 8-bit groups of 32), within about 0.4-0.8% RMS of
the fp8 values, exact for int8 with fp16-representable scales.
Routed experts' and DeepSeek MLA's linears are among those (per-expert tensors, or transformers 5's stacked
`experts.gate_up_proj` with its `_scale_inv`, split per expert here). Everything else (8-bit GPTQ, groups
that split a block, fused matrices) is dequantized here to float32
(`weight` [out, in]); the backend casts it to its compute dtype.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.hf_nvfp4 import nvfp4_method
from localchat.weights.hf_q8_blocks import E4M3FN, Q8_0_BYTES, q8_linear
from localchat.weights.hf_quant_blocks import BLOCK, repack_int4
from localchat.weights.hf_quant_fp8 import (
    ACTIVATION_SCALES,
    DELTANET_GATES,
    deltanet_gate,
    dequantize_fp8,
    fp8_part,
    log_ignored,
)
from localchat.weights.hf_quant_names import compactable
from localchat.weights.tensors import WeightTensor

log = logging.getLogger(__name__)

# Storage dtypes quantized checkpoints add to F32/F16/BF16: packed int32 codes, fp8 bytes, int8.
QUANT_STORAGE = {"I32": np.int32, "F8_E4M3": np.uint8, "I8": np.int8, "I64": np.int64, "U8": np.uint8}
METHODS = ("gptq", "awq", "fp8", "compressed-tensors")
# compressed-tensors parts; activation scales (W8A8 static input_scale) are dropped: we compute in bf16/f32.
_CT_PARTS = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "input_scale")
_GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")
# AutoAWQ's GEMM layout puts output column ORDER[i] in nibble i of each int32; UNDO inverts it.
_AWQ_UNDO = np.array([0, 4, 1, 5, 2, 6, 3, 7])
# transformers 5's stacked FP8 experts: `<...>.experts.gate_up_proj` and `<...>.experts.gate_up_proj_scale_inv`
_STACKED_FP8 = re.compile(r"(?P<base>.+\.experts\.[A-Za-z_]\w*?)(?P<scale>_scale_inv)?")


def quant_method(raw_config: dict[str, Any]) -> str | None:
    """The folder's quantization method, None for a dense checkpoint; unknown methods are refused."""
    qc = raw_config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
    if (nvfp4 := nvfp4_method(qc)) is not None:  # ModelOpt / compressed-tensors NVFP4: weights/hf_nvfp4.py
        return nvfp4
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
    codes, zeros, groups = gptq_codes(qweight, qzeros, g_idx, group_size, zero_offset)
    s = np.asarray(scales, dtype=np.float32)
    w = (codes - zeros[groups]).astype(np.float32) * s[groups]
    return np.ascontiguousarray(w.T)


def gptq_codes(
    qweight: np.ndarray, qzeros: np.ndarray, g_idx: np.ndarray | None, group_size: int, zero_offset: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ's codes [in, out], zeros [groups, out] and each input column's group [in]."""
    codes = unpack_int4(qweight, axis=0)
    zeros = unpack_int4(qzeros, axis=1) + zero_offset
    n_in = codes.shape[0]
    groups = np.arange(n_in) // group_size if g_idx is None else np.asarray(g_idx, dtype=np.int64)
    return codes, zeros, groups


def dequantize_awq(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int
) -> np.ndarray:
    """AWQ GEMM: qweight [in, out/8] and qzeros [groups, out/8] packed along out in AWQ's interleaved
    nibble order, zeros stored as is. Returns float32 [out, in]."""
    codes, zeros = awq_columns(qweight), awq_columns(qzeros)
    groups = np.arange(codes.shape[0]) // group_size
    w = (codes - zeros[groups]).astype(np.float32) * np.asarray(scales, dtype=np.float32)[groups]
    return np.ascontiguousarray(w.T)


def awq_columns(packed: np.ndarray) -> np.ndarray:
    """AWQ GEMM int32 words [rows, cols/8] -> codes [rows, cols] in output column order."""
    codes = unpack_int4(packed, axis=1)
    rows, cols = codes.shape
    return codes.reshape(rows, cols // 8, 8)[:, :, _AWQ_UNDO].reshape(rows, cols)


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
    tally: dict[str, int] = {}  # linears by the form handed over, for the log line
    ignored: dict[str, int] = {}  # FP8 activation / KV-cache scales dropped, by name (hf_quant_fp8.py)
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
                yield _counted(tally, _ct_compact(module, parts, _ct_bits(qconfig)), module, parts, qconfig)
                parts.clear()
            continue
        stacked = _STACKED_FP8.fullmatch(t.name) if method == "fp8" else None
        if stacked is not None and (t.dtype == "F8_E4M3" or stacked["scale"]):
            parts = pending.setdefault(stacked["base"], {})
            parts["weight_scale_inv" if stacked["scale"] else "weight"] = (
                t.dequantize() if stacked["scale"] else np.asarray(t.data)
            )
            if len(parts) == 2:
                del pending[stacked["base"]]
                yield from _fp8_experts(tally, stacked["base"], parts, (bo, bi), qconfig)
            continue
        role = fp8_part(module, part, t.dtype) if method == "fp8" else None
        if role == "ignored":
            ignored[part] = ignored.get(part, 0) + 1
            continue
        if role is not None:  # `weight_scale` (AutoFP8) is the same multiplier as `weight_scale_inv`
            parts = pending.setdefault(module, {})
            parts["weight" if role == "weight" else "weight_scale_inv"] = (
                np.asarray(t.data) if role == "weight" else t.dequantize()
            )
            if len(parts) == 2:
                del pending[module]
                compact = _fp8_compact(module, parts, (bo, bi))
                yield _counted(tally, compact, module, parts, qconfig)
            continue
        if method in ("gptq", "awq") and part in _GPTQ_PARTS:
            parts = pending.setdefault(module, {})
            parts[part] = np.asarray(t.data) if t.dtype == "I32" else t.dequantize()
            if {"qweight", "qzeros", "scales"} <= parts.keys() and ("g_idx" in parts or method == "awq"):
                del pending[module]
                yield _counted(
                    tally, _int4_compact(method, module, parts, group, offset), module, parts, qconfig
                )
            continue
        if t.dtype in QUANT_STORAGE:
            raise ModelLoadError(f"Tensor {t.name} ({t.dtype}) is not part of a {method} linear layer.")
        gate = deltanet_gate(t) if method in ("fp8", "compressed-tensors") else None  # no act-order there
        tally["Q8_0 of bf16 DeltaNet b/a"] = tally.get("Q8_0 of bf16 DeltaNet b/a", 0) + (gate is not None)
        yield t if gate is None else gate
    for module, parts in pending.items():
        if method == "compressed-tensors" and (module in done or set(parts) <= {"input_scale"}):
            continue  # activation scales (W8A8) of an already yielded or unquantized layer: unused
        elif method == "gptq" and {"qweight", "qzeros", "scales"} <= parts.keys():  # no g_idx saved
            yield _counted(tally, _int4_compact(method, module, parts, group, offset), module, parts, qconfig)
        else:
            raise ModelLoadError(f"Quantized layer {module} lacks {sorted(parts)} counterpart tensors.")
    _log_tally(method, tally)
    log_ignored(ignored)


def _fp8_experts(
    tally: dict[str, int],
    base: str,
    parts: dict[str, np.ndarray],
    block: tuple[int, int],
    qconfig: dict[str, Any],
) -> Iterator[WeightTensor]:
    """transformers 5's stacked FP8 experts (`experts.gate_up_proj` [E, out, in] e4m3, `..._scale_inv`
    [E, out / 128, in / 128] or one per expert): one linear per expert, named as experts.py splits them."""
    codes, scale = parts["weight"], np.asarray(parts["weight_scale_inv"], dtype=np.float32)
    if codes.ndim != 3 or not (scale.size == 1 or scale.shape[0] == codes.shape[0]):
        raise ModelLoadError(
            f"FP8 experts {base} {codes.shape} with scales {scale.shape}: expected [experts, out, in] with "
            "one scale block table per expert; the checkpoint may be damaged."
        )
    prefix, _, leaf = base.rpartition(".")
    for e in range(codes.shape[0]):
        own = scale.reshape(()) if scale.size == 1 else scale[e]
        expert = {"weight": codes[e], "weight_scale_inv": own}
        module = f"{prefix}.{e}.{leaf}"
        # the stacked form's per-expert name has no `.weight` (the registry maps `experts.{e}.gate_up_proj`)
        yield replace(
            _counted(tally, _fp8_compact(module, expert, block), module, expert, qconfig), name=module
        )


def _counted(
    tally: dict[str, int],
    compact: WeightTensor | None,
    module: str,
    parts: dict[str, np.ndarray],
    qconfig: dict[str, Any],
) -> WeightTensor:
    """`compact`, else the module dequantized to float32; counted by form in `tally`."""
    if compact is None:
        tally["dense"] = tally.get("dense", 0) + 1
        return _dense(module, _dequantized(parts, qconfig))
    kind = getattr(compact, "qtype", "") + (
        " act-order" if getattr(compact, "order", None) is not None else ""
    )
    tally[kind] = tally.get(kind, 0) + 1
    return compact


def _log_tally(method: str, tally: dict[str, int]) -> None:
    compact = {k: v for k, v in tally.items() if k != "dense" and v}
    if compact:
        log.info(
            "%s checkpoint: %s quantized linears handed over as GGUF blocks (%s): kept compact on "
            "localchat's CPU kernels, dequantized (exactly, float32) by backends without them",
            method,
            sum(compact.values()),
            ", ".join(f"{v} {k}" for k, v in sorted(compact.items())),
        )
    if tally.get("dense"):
        log.info(
            "%s checkpoint: %s quantized linears dequantized at load (float32, then the compute dtype): "
            "no compact form for them (8-bit GPTQ, a group or scale block that is not a multiple of %s, or "
            "a fused or expert matrix)",
            method,
            tally["dense"],
            BLOCK,
        )


def _int4_compact(
    method: str, module: str, parts: dict[str, np.ndarray], group: int, offset: int
) -> WeightTensor | None:
    """A GPTQ / AWQ linear as blocks (hf_quant_blocks.py), None where it has no such form."""
    if not compactable(module):
        return None
    if method == "awq":
        codes, zeros = awq_columns(parts["qweight"]), awq_columns(parts["qzeros"])
        groups = np.arange(codes.shape[0]) // group
    else:
        g_idx = parts.get("g_idx")
        idx = None if g_idx is None else g_idx.astype(np.int64)
        codes, zeros, groups = gptq_codes(parts["qweight"], parts["qzeros"], idx, group, offset)
    return repack_int4(f"{module}.weight", codes.T, np.asarray(parts["scales"]).T, zeros.T, groups)


def _fp8_compact(module: str, parts: dict[str, np.ndarray], block: tuple[int, int]) -> WeightTensor | None:
    """An FP8 linear (`weight_scale_inv` per tensor or per block) as Q8_0 (hf_q8_blocks.py), None where
    it has no such form."""
    if not compactable(module):
        return None
    scale = np.asarray(parts["weight_scale_inv"], dtype=np.float32)
    rows, cols = parts["weight"].shape
    if scale.size > 1 and scale.shape != (-(-rows // block[0]), -(-cols // block[1])):
        return None  # dequantize_fp8 names the mismatch
    return q8_linear(f"{module}.weight", parts["weight"], scale, block)


def _ct_compact(module: str, parts: dict[str, np.ndarray], bits: int) -> WeightTensor | None:
    """Symmetric pack-quantized W4A16 by group or channel as Q4_0 blocks, float-quantized FP8 and
    int-quantized int8 (W8A8) as Q8_0; None where it has no such form."""
    if not compactable(module):
        return None
    if bits == 8 and "weight" in parts:
        return _ct_q8(module, parts)
    if bits != 4 or "weight_packed" not in parts:
        return None
    rows, cols = (int(d) for d in parts["weight_shape"])
    scale = np.asarray(parts["weight_scale"], dtype=np.float32)
    if scale.ndim != 2 or scale.shape[0] != rows or cols % scale.shape[1]:
        return None
    codes = unpack_ct(parts["weight_packed"], (rows, cols), bits) + 8  # stored q + 8: Q4_0's code
    return repack_int4(f"{module}.weight", codes, scale, None, np.arange(cols) // (cols // scale.shape[1]))


def _ct_q8(module: str, parts: dict[str, np.ndarray]) -> WeightTensor | None:
    """compressed-tensors 8-bit (fp8 bytes or int8) with a scale per tensor, channel, group or block."""
    codes = parts["weight"]
    scale = np.asarray(parts["weight_scale"], dtype=np.float32)
    rows, cols = codes.shape
    if scale.size > 1 and scale.ndim != 2:
        return None
    reps = (1, 1) if scale.size == 1 else (-(-rows // scale.shape[0]), -(-cols // scale.shape[1]))
    return q8_linear(f"{module}.weight", codes, scale, reps)


def _dequantized(parts: dict[str, np.ndarray], qconfig: dict[str, Any]) -> np.ndarray:
    method = str(qconfig.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _ct_weight(parts, _ct_bits(qconfig))
    if method == "fp8":
        bo, bi = (int(v) for v in qconfig.get("weight_block_size") or (128, 128))
        return dequantize_fp8(parts["weight"], parts["weight_scale_inv"], (bo, bi))
    group = int(qconfig.get("group_size", 128))
    offset = 0 if str(qconfig.get("checkpoint_format", "gptq")) == "gptq_v2" else 1
    return _gptq_or_awq(method, parts, group if group > 0 else 1 << 30, offset)


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
# Bytes per 32 values of the blocks a compact part becomes: GPTQ/AWQ Q4_1, compressed-tensors Q4_0.
_COMPACT_BLOCK_BYTES = {"qweight": 20, "weight_packed": 18}


def compact_blocks(raw_config: dict[str, Any]) -> bool:
    """Whether the folder's layer linears are handed over as blocks: 4-bit GPTQ / AWQ / compressed-tensors
    whose groups are whole 32-value blocks (`repack_int4`), FP8 and compressed-tensors 8-bit (FP8, int8)
    whose scales are constant over 32 values (`q8_linear`); per-tensor sizes are checked again at load."""
    qc = raw_config.get("quantization_config") or {}
    method = str(qc.get("quant_method", "")).lower()
    if method in ("gptq", "awq"):
        group = int(qc.get("group_size", 128))
        return int(qc.get("bits", 4)) == 4 and (group <= 0 or group % BLOCK == 0)
    if method == "fp8":
        block = qc.get("weight_block_size")
        return not block or int(block[-1]) % BLOCK == 0
    if method != "compressed-tensors":
        return False
    for group_config in (qc.get("config_groups") or {}).values():
        weights = (group_config or {}).get("weights") or {}
        strategy, size = weights.get("strategy"), weights.get("group_size")
        if int(weights.get("num_bits", 8)) not in (4, 8):
            return False
        if strategy == "block":
            structure = weights.get("block_structure") or [0, 0]
            if int(structure[-1]) % BLOCK:
                return False
        elif strategy not in ("channel", "tensor") and not (isinstance(size, int) and size % BLOCK == 0):
            return False
        if strategy == "tensor" and int(weights.get("num_bits", 8)) == 4:
            return False  # W4A16 per tensor is not a layout _ct_compact takes
    return True


compact_int4 = compact_blocks  # the name models/memory.py imported first


def loaded_weight_bytes(
    headers: list[dict[str, Any]],
    value_bytes: int,
    bits: int = 4,
    compact: bool = False,
    affine: bool = False,
) -> int:
    """Bytes the weights take once loaded, from safetensors headers: what the pre-load RAM check counts
    for a quantized folder instead of its (4x-8x smaller) file size. Dequantized parts at `value_bytes`
    per value; with `compact` (`compact_blocks`, and a backend that keeps the blocks) the int4 layer
    linears at their blocks' 4.5 (Q4_0) or 5 (Q4_1) bits per weight, the 8-bit (FP8, int8) ones (and an FP8 /
    compressed-tensors folder's bf16 DeltaNet b / a, `deltanet_gate`) at Q8_0's 8.5. `affine`: MLX's form of those
    blocks instead, 4 or 8 bits plus a scale and a bias per 32 values at `value_bytes` each (8-bit: 10 bits
    a weight in float32, 9 in bf16 / fp16)."""
    q8 = 32 + 2 * value_bytes if affine else Q8_0_BYTES  # bytes per 32 values
    int4 = {k: 16 + 2 * value_bytes for k in _COMPACT_BLOCK_BYTES} if affine else _COMPACT_BLOCK_BYTES
    gates = compact and not any(n.endswith(".qweight") for h in headers for n in h)  # `deltanet_gate`'s
    total = 0
    for header in headers:
        for name, info in header.items():
            module, _, part = name.rpartition(".")
            begin, end = info["data_offsets"]
            count = int(np.prod([int(d) for d in info["shape"]], dtype=np.int64))
            if info["dtype"] not in QUANT_STORAGE:
                scale = part in _CT_PARTS or part in ACTIVATION_SCALES or part.endswith("scale_inv")
                gate = gates and DELTANET_GATES.fullmatch(name) is not None
                total += 0 if scale else count * q8 // BLOCK if gate else int(end) - int(begin)
            elif info["dtype"] == "F8_E4M3" and _STACKED_FP8.fullmatch(name):  # per expert, as split
                held = compact and compactable(f"{module}.0.{part}")
                total += count * q8 // BLOCK if held else count * value_bytes
            elif compact and bits == 4 and part in int4 and compactable(module):
                total += count * 8 * int4[part] // BLOCK
            elif compact and part == "weight" and info["dtype"] in ("F8_E4M3", "I8") and compactable(module):
                total += count * q8 // BLOCK
            elif part in _EXPANSION:
                total += count * (_EXPANSION[part] or 32 // bits) * value_bytes
    return total
