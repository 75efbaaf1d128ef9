"""How much RAM a model needs before it is loaded, and the check that refuses a load that would not fit
(a typed error the user can act on, instead of the OS killing the server half-way through a load)."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat import cpu_features
from localchat.arch.architecture import TOP_WEIGHTS, Architecture
from localchat.arch.registry import architecture
from localchat.engine.config import DEFAULT_STATE_CHECKPOINTS
from localchat.errors import InsufficientMemoryError, ModelLoadError, UnsupportedArchitectureError
from localchat.models.side_memory import SideModelMemory, side_models_note
from localchat.vision.mmproj import pair_mmproj
from localchat.weights.gguf import gguf_architecture, hf_tensor_name, open_gguf
from localchat.weights.hf_nvfp4 import NVFP4_METHODS, nvfp4_loaded_bytes
from localchat.weights.hf_quant import compact_int4, loaded_weight_bytes, quant_method
from localchat.weights.isq_plan import LINEAR_PARAMS, Role, isq_bytes
from localchat.weights.mlx_groups import mlx_tensor_bytes
from localchat.weights.safetensors import (
    checkpoint_prefixes,
    config_from_folder,
    renamed,
    safetensors_files,
)
from localchat.weights.x16 import kernel_isa, loaded_block_bytes

MIB = 2**20
GIB = 2**30
RUNTIME_OVERHEAD = 400 * MIB  # torch + tokenizer + engine bookkeeping, measured ~350 MiB on SmolLM2-135M
MIN_KV_BUDGET = (
    256 * MIB
)  # without --kv-cache-mib the engine sizes its KV cache from what is left: count a floor
# GGUF types the backends read in their blocks (file size once loaded): with localchat's compiled CPU
# kernels every common type; without them only Q4_0/Q4_1 (torch's int4 kernel), the rest expanded to
# bf16. The compiled kernels also read the i-quants and ternary types in place (csrc/lc_iquants.h: no x16
# form, so file size), MXFP4 (gpt-oss's experts, csrc/lc_mxfp4.h) and NVFP4 / Q1_0 / Q2_0
# (csrc/lc_lowbit.h); anything else is expanded: 2 bytes
# per value. MLX holds its own form instead, sized by weights/mlx_groups.py (`_mlx_gguf_bytes`).
_CLASSIC_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
_IQ_TYPES = {"IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"}
_KERNEL_TYPES = frozenset(_CLASSIC_TYPES | _IQ_TYPES | {"TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0"})
_INT4_TYPES = frozenset({"Q4_0", "Q4_1"})
FAST_GEMM_ISAS = frozenset({"avx512vnni", "avx2", "neon"})  # quant.FAST_GEMM_ISAS (this never imports torch)
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")
_FLOAT = ("f16", "bf16", "f32")  # the GGUF files `--isq` quantizes (it leaves quantized tensors as they are)
_BITS = {  # bits per weight of a file type (the filename's, when its tensor table is unreadable)
    "iq1_s": 1.6,
    "iq1_m": 1.8,
    "iq2_xxs": 2.1,
    "iq2_xs": 2.3,
    "iq2_s": 2.6,
    "iq3_xxs": 3.1,
    "iq3_s": 3.4,
    "iq4_xs": 4.3,
    "iq4_nl": 4.5,
    "tq1_0": 1.7,
    "tq2_0": 2.1,
    "q1_0": 1.125,
    "q2_0": 2.25,
    "mxfp4": 4.25,
    "nvfp4": 4.5,
    "q2_k": 2.6,
    "q3_k": 3.4,
    "q4_k": 4.8,
    "q5_0": 5.5,
    "q5_1": 6.0,
    "q5_k": 5.5,
    "q6_k": 6.6,
    "q8_0": 8.5,
}


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    overhead: int
    draft: int = 0  # a draft model's weights, KV and state rows, or an EAGLE head's weights: draft_bytes

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead + self.draft

    @property
    def target(self) -> int:
        return self.weights + self.kv_cache + self.overhead


def path_size(path: Path) -> int:
    """A GGUF file's size, or the sum of a model folder's files (symlinks into the HF cache followed)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_file():
                total += child.stat().st_size
    return total


def estimate(
    path: Path,
    kv_cache_mib: int | None,
    isq: str | None = None,
    dtype: str = "bfloat16",
    max_num_seqs: int = 32,
    backend: str = "torch",
    state_checkpoints: int = DEFAULT_STATE_CHECKPOINTS,
    spec_rows: int = 0,
) -> MemoryEstimate:
    """`isq`: the `--isq` type dense weights are quantized to at load (they are sized in that format);
    `dtype`: the compute dtype (`compute_dtype`): float32 doubles what is expanded, and decides which
    block types stay compact. Hybrid models add their state pool (one slot per `max_num_seqs`, plus
    `state_checkpoints` prefix checkpoints and `spec_rows` rows for speculative verify steps'
    per-position states, engine/hybrid_spec.py) to the KV floor; with `--kv-cache-mib` the engine takes
    the pool out of that budget, so it is already counted.
    `backend` (`--backend`): MLX keeps a quantized folder's blocks as its own affine groups, kernels or not,
    and a GGUF's tensors in its own form per type (`_mlx_gguf_bytes`)."""
    size = path_size(path)
    weights = size
    if path.suffix == ".gguf":
        quant = _quant_of(path.name)
        if isq is not None and quant in _FLOAT:
            weights = _isq_weights(path, isq, size)
        elif _mlx_likely(backend):
            weights = _mlx_gguf_bytes(path, _value_bytes(dtype), size)
        elif quant not in _FLOAT:
            weights = _loaded_gguf_bytes(path, compact_gguf_types(dtype), size, quant, _value_bytes(dtype))
        weights += _vision_projector_bytes(path, dtype)
    elif isq is not None and path.is_dir():
        weights = _isq_weights(path, isq, size)
    elif path.is_dir():
        affine = _mlx_likely(backend)
        blocks = affine or "Q4_1" in compact_gguf_types(dtype)
        weights = _hf_quant_weights(path, _value_bytes(dtype), size, blocks, affine)
    kv = (
        kv_cache_mib * MIB
        if kv_cache_mib is not None
        else MIN_KV_BUDGET + _state_pool(path, dtype, max_num_seqs + state_checkpoints + spec_rows)
    )
    return MemoryEstimate(weights, kv, RUNTIME_OVERHEAD)


def draft_bytes(
    path: Path,
    kv_cache_mib: int | None,
    isq: str | None = None,
    dtype: str = "bfloat16",
    backend: str = "torch",
    state_rows: int = 0,
    eagle: bool = False,
) -> int:
    """What speculative decoding loads beside the target. A draft model (engine/draft_model.py): its
    weights sized as `estimate` sizes a target's (its own quant, the same --isq / dtype / backend), its
    KV floor (its pool holds at most the target pool's tokens at fewer bytes each: --kv-cache-mib caps
    the floor) and, for a hybrid draft, `state_rows` state rows (engine/draft_states.py: max_batch x k,
    live + snapshots). An EAGLE-3 head (`eagle`): its weights, held at the target's compute dtype."""
    if eagle:
        return path_size(path) * _value_bytes(dtype) // 2
    weights = estimate(path, 0, isq, dtype, backend=backend).weights
    floor = MIN_KV_BUDGET if kv_cache_mib is None else min(MIN_KV_BUDGET, kv_cache_mib * MIB)
    return weights + floor + _state_pool(path, dtype, state_rows)


def _vision_projector_bytes(path: Path, dtype: str) -> int:
    """The mmproj paired with a GGUF (localchat.vision.mmproj), loaded at the compute dtype: its f16
    file's size scaled by bytes per value over 2."""
    try:
        mmproj = pair_mmproj(path)
    except ModelLoadError:
        return 0
    return 0 if mmproj is None else mmproj.stat().st_size * _value_bytes(dtype) // 2


def _state_pool(path: Path, dtype: str, max_num_seqs: int) -> int:
    """A hybrid model's per-sequence state times the slots (running sequences and checkpoints; 0 for
    other models)."""
    try:
        if path.suffix == ".gguf" and path.is_file():
            from localchat.weights.gguf import config_from_gguf, open_gguf

            config = config_from_gguf(open_gguf(path))  # the metadata only; tensors stay unread
        elif path.is_dir():
            from localchat.weights.safetensors import config_from_folder  # only folders pay for the import

            config = config_from_folder(path)
        else:
            return 0
    except (ModelLoadError, UnsupportedArchitectureError):
        return 0  # the load itself reports it
    arch = architecture(config.model_type)
    if arch.state_bytes is None:
        return 0
    return arch.state_bytes(config, 4 if dtype == "float32" else 2) * max_num_seqs


def compact_gguf_types(dtype: str = "bfloat16") -> frozenset[str]:
    """The GGUF types a load keeps in their blocks on this install (see `_KERNEL_TYPES`), as
    quant.pick_policy decides per kernels' ISA and compute dtype (its `auto` mode): float32 compute keeps
    blocks only on a kernel ISA with a fast many-row path (portable C and no kernels: all dense float32)."""
    isa = kernel_isa()  # by name: this module never imports the torch backend
    if dtype == "float32":
        return _KERNEL_TYPES if isa in FAST_GEMM_ISAS else frozenset()
    return _KERNEL_TYPES if isa is not None else _INT4_TYPES


def compute_dtype(dtype: str, device: str = "auto", backend: str = "auto") -> str:
    """The compute dtype a load will use, for sizing: `--dtype` when given; on the torch backend's CPU
    path `auto` is bfloat16 or float32 by the CPU (cpu_features.py); MLX's `auto` is float32 on its CPU
    device (`--device cpu`, or no Metal: not Apple Silicon) and 2 bytes on Metal (runner.pick_dtype);
    elsewhere (a GPU) 2 bytes."""
    if dtype != "auto":
        return dtype
    if _mlx_likely(backend):
        metal = sys.platform == "darwin" and platform.machine() == "arm64"
        return "bfloat16" if metal and device != "cpu" else "float32"
    gpu_likely = sys.platform == "darwin" or os.path.exists("/proc/driver/nvidia/version")
    if backend == "mlx" or device not in ("auto", "cpu") or (device == "auto" and gpu_likely):
        return "bfloat16"
    return cpu_features.compute_dtype(cpu_features.cpu_flags())


def _value_bytes(dtype: str) -> int:
    """Bytes per expanded (dequantized) value in the compute dtype."""
    return 4 if dtype == "float32" else 2


def _loaded_gguf_bytes(
    path: Path, compact: frozenset[str], size: int, quant: str | None, value_bytes: int = 2
) -> int:
    """A quantized GGUF's weights once loaded, tensor by tensor (a Q4_K_M file mixes Q4_K, Q6_K and
    F32): compact types as stored, other quantized types at `value_bytes` a value (float tensors too,
    when that is wider than stored). Unreadable: the filename's type."""
    try:
        from gguf import GGMLQuantizationType as Q

        from localchat.weights.gguf import open_gguf

        total = 0
        reader = open_gguf(path)
        held_as = _held_at_load(reader)
        for t in reader.tensors:
            kind = Q(t.tensor_type)
            dims = [int(d) for d in t.shape.tolist()]  # innermost first: [cols, rows(, experts)]
            stored = int(t.n_bytes)
            slices = held_as(t.name, kind.name) if kind not in (Q.F32, Q.F16, Q.BF16) else 1
            if slices == 0:
                total += int(t.n_elements) * value_bytes
                continue
            if len(dims) in (2, 3) and kind.name in compact:  # stacked experts: each its own matrix
                parts = (dims[2] if len(dims) == 3 else 1) * slices
                stored = parts * loaded_block_bytes(kind.name, dims[1] // slices, dims[0], stored // parts)
            if kind in (Q.F32, Q.F16, Q.BF16):
                total += max(stored, int(t.n_elements) * value_bytes) if value_bytes > 2 else stored
            else:
                total += stored if kind.name in compact else int(t.n_elements) * value_bytes
        return total
    except (ModelLoadError, OSError, ValueError, KeyError, TypeError):
        if quant is None or quant.upper() in compact:
            return size
        return int(size * 8 * value_bytes / _BITS.get(quant, 16.0))


def _mlx_gguf_bytes(path: Path, value_bytes: int, size: int) -> int:
    """A GGUF's weights as the MLX backend holds them, tensor by tensor (weights/mlx_groups.py): the types
    it maps exactly or re-quantizes at their MLX bits plus a scale and bias per 32 in the compute dtype
    (Q3_K: 3.44 bits a weight in the file, 6 in bf16), the rest at the compute dtype. `size` when the
    tensor table is unreadable (the load then says what is wrong)."""
    try:
        from gguf import GGMLQuantizationType as Q

        total = 0
        for t in open_gguf(path).tensors:
            dims = [int(d) for d in t.shape.tolist()]
            total += mlx_tensor_bytes(Q(t.tensor_type).name, dims, int(t.n_bytes), value_bytes)
        return total
    except (ModelLoadError, OSError, ValueError, KeyError, TypeError):
        return size


def _held_at_load(reader: Any) -> Callable[[str, str], int]:
    """How the torch loader holds a quantized tensor (name, type) of a hybrid's GGUF: 0 expanded to the
    compute dtype, else in its blocks as that many equal row slices. Expanded: what it does not run through
    `linear` (LINEAR_PARAMS; the recurrent layers' projections are among those it keeps in blocks; a
    qwen35 `ssm_out` whose value heads move by less than a block keeps its blocks too, with the column
    order beside them: weights/ordered_blocks.py). Qwen3-Next's grouped b|a is held as its two halves
    (its sanitize splits the rows into in_proj's b and a parts)."""
    try:
        entry = gguf_architecture(reader)
    except (ModelLoadError, UnsupportedArchitectureError):
        return lambda name, qtype: 1
    if entry.state_bytes is None:
        return lambda name, qtype: 1

    def held_as(gguf_name: str, qtype: str) -> int:
        try:
            match = _LAYER_NAME.fullmatch(hf_tensor_name(gguf_name, entry) or "")
        except ModelLoadError:
            return 1
        found = entry.layer_weight(match.group(2)) if match else None
        if found is None:  # Qwen3-Next's grouped b|a
            return 2 if match is not None and match.group(2).endswith("in_proj_ba.weight") else 1
        return 1 if found[0].rpartition(".")[2] in LINEAR_PARAMS else 0

    return held_as


def _mlx_likely(backend: str) -> bool:
    """Whether the load runs on MLX: `--backend mlx`, or `auto` on Apple Silicon (resolve_backend's rule,
    without importing mlx here)."""
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    return backend == "mlx" or (backend == "auto" and apple)


def _hf_quant_weights(
    folder: Path, value_bytes: int, size: int, blocks: bool = False, affine: bool = False
) -> int:
    """A GPTQ / AWQ / FP8 / compressed-tensors folder is dequantized at load (weights/hf_quant.py): sized
    as expanded, except the linears that stay blocks: GGUF blocks where the kernels keep Q4_1 (`blocks`;
    with the kernels present, see compact_gguf_types): ~4.5-5 bits a weight for int4, 8.5 for FP8 / int8;
    on MLX (`affine`, kernels or not) its 4- / 8-bit groups with a scale and bias per 32 in the compute
    dtype (FP8: 9 bits a weight in bf16, 10 in float32). `size` for a dense folder, or when unreadable
    (the load then says what is wrong)."""
    import json

    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if (method := quant_method(raw)) is None:
            return size
        headers = [f.header for f in safetensors_files(folder, quantized=True)]
        if method in NVFP4_METHODS:  # GGUF NVFP4 blocks where kept (kernels, MLX): as the file
            return nvfp4_loaded_bytes(headers, value_bytes, blocks and (affine or kernel_isa() is not None))
        qc = raw["quantization_config"]
        groups = list((qc.get("config_groups") or {}).values())
        bits = int(((groups[0] or {}).get("weights") or {}).get("num_bits", 4)) if groups else 4
        compact = blocks and (affine or kernel_isa() is not None) and compact_int4(raw)
        return loaded_weight_bytes(headers, value_bytes, bits, compact, affine)
    except (ModelLoadError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return size


def _isq_weights(path: Path, isq: str, size: int) -> int:
    """The weights' bytes once quantized at load: each tensor by weights/isq_plan.py's rule (what the torch
    backend applies), from the safetensors headers or the GGUF tensor table. `size` when unreadable: the
    load itself then reports what is wrong with the files."""
    try:
        tensors = _gguf_tensors(path) if path.is_file() else _safetensors_tensors(path)
    except (ModelLoadError, OSError, ValueError, KeyError, TypeError):
        return size
    return sum(isq_bytes(isq, role, shape, nbytes) for role, shape, nbytes in tensors)


Tensor = tuple[Role, tuple[int, ...], int]  # what --isq does to it, shape, bytes as stored


def _role(name: str | None, arch: Architecture) -> Role:
    """Whether the backend quantizes the tensor `name` (HF naming) as a linear, as the embedding / LM
    head, or leaves it as stored."""
    if name is None:
        return "other"
    if name in TOP_WEIGHTS:
        return "head" if TOP_WEIGHTS[name] in ("embed", "lm_head") else "other"
    match = _LAYER_NAME.fullmatch(name)
    found = arch.layer_weight(match.group(2)) if match else None
    return "linear" if found and found[0].rpartition(".")[2] in LINEAR_PARAMS else "other"


def _safetensors_tensors(folder: Path) -> list[Tensor]:
    arch = architecture(config_from_folder(folder).model_type)
    prefixes = checkpoint_prefixes(folder)
    out: list[Tensor] = []
    for file in safetensors_files(folder):
        for stored, info in file.header.items():
            name = renamed(stored, prefixes)
            if name is not None:  # a multimodal wrapper's other towers are never loaded
                begin, end = info["data_offsets"]
                out.append((_role(name, arch), tuple(int(d) for d in info["shape"]), int(end) - int(begin)))
    return out


def _gguf_tensors(path: Path) -> list[Tensor]:
    from gguf import GGMLQuantizationType as Q

    reader = open_gguf(path)
    arch = gguf_architecture(reader)
    out: list[Tensor] = []
    for t in reader.tensors:
        dense = t.tensor_type in (Q.F32, Q.F16, Q.BF16)  # --isq leaves quantized tensors as they are
        try:
            role = _role(hf_tensor_name(t.name, arch), arch) if dense else "other"
        except ModelLoadError:
            role = "other"
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims innermost first
        out.append((role, shape, int(t.n_bytes)))
    return out


def _quant_of(filename: str) -> str | None:
    match = re.search(
        r"(iq\d_(?:xxs|xs|s|m|nl)|tq\d_\d|q\d_k|q\d_\d|mxfp4|nvfp4|f16|bf16|f32)", filename.lower()
    )
    return match.group(1) if match else None


def check_fits(
    name: str,
    need: MemoryEstimate,
    available: int | None,
    freeable: int = 0,
    side: Sequence[SideModelMemory] = (),
) -> None:
    """Raise when `need` exceeds the free RAM plus what unloading other models would give back. `side`:
    the embedding/rerank models beside the chat models, never unloaded for one (side_memory.py)."""
    if available is None:
        return  # unknown platform: let the load try
    room = max(0, available + freeable - sum(m.file_backed for m in side))
    if need.total <= room:
        return
    parts = (
        f"weights {need.weights / GIB:.1f}, KV cache {need.kv_cache / GIB:.1f}, runtime "
        f"{need.overhead / GIB:.1f}"
    )
    if need.draft:
        parts = f"target {need.target / GIB:.1f} GiB: {parts}; + draft {need.draft / GIB:.1f} GiB"
    advice = ", pick a smaller draft model (--draft-model) or --speculative ngram" if need.draft else ""
    raise InsufficientMemoryError(
        f"Model {name!r} needs about {need.total / GIB:.1f} GiB of RAM ({parts}) but only "
        f"{room / GIB:.1f} GiB is free. Close other programs, unload a model, lower --kv-cache-mib{advice}, "
        "or pick a smaller model or quant." + side_models_note(side),
        param="model",
    )
