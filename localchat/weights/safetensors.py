"""Hugging Face model folders: config.json, generation_config.json and memory-mapped *.safetensors.

A safetensors file is an 8-byte little-endian header length, a JSON header
({name: {"dtype", "shape", "data_offsets": [begin, end]}}), then the raw tensor bytes. We map each file
once and hand out numpy views into it, so nothing is copied until a backend converts a tensor.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localchat.arch.registry import ARCHITECTURES, SUPPORTED_MODEL_TYPES
from localchat.errors import ModelLoadError, UnsupportedArchitectureError
from localchat.weights.config import ModelConfig
from localchat.weights.hf_quant import QUANT_STORAGE
from localchat.weights.tensors import WeightTensor

# safetensors dtype -> (numpy dtype of the raw view, WeightTensor dtype). bf16 travels as uint16 bits.
_DTYPES = {"F32": (np.float32, "F32"), "F16": (np.float16, "F16"), "BF16": (np.uint16, "BF16")}
_GENERATION_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(slots=True)
class SafetensorsFile:
    path: Path
    header: dict[str, Any]  # tensor name -> {"dtype", "shape", "data_offsets"}
    data_start: int  # byte offset of the tensor data (8 + header length)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}") from exc


def config_from_folder(folder: Path) -> ModelConfig:
    raw = _read_json(folder / "config.json")
    model_type = str(raw.get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitectureError(model_type or "(no model_type)", list(SUPPORTED_MODEL_TYPES))
    arch = ARCHITECTURES[model_type]
    if arch.text_config_key is not None:  # a multimodal wrapper: run its text LM
        text = raw.get(arch.text_config_key) or {}
        if not text and "hidden_size" in raw and f"{model_type}_text" in ARCHITECTURES:
            text = {**raw, "model_type": f"{model_type}_text"}  # Qwen2.5-VL's hub files: text keys on top
        inherited: dict[str, Any] = {
            k: raw[k]
            for k in ("bos_token_id", "eos_token_id", "tie_word_embeddings", "torch_dtype", "dtype")
            if k in raw
        }
        raw = {**inherited, **text}
        if raw.get("model_type") not in SUPPORTED_MODEL_TYPES or raw.get("model_type") == model_type:
            inner = str(raw.get("model_type") or "(none)")
            raise UnsupportedArchitectureError(
                f"{model_type} with text model {inner}", list(SUPPORTED_MODEL_TYPES)
            )
    try:
        return ModelConfig.from_hf_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{folder / 'config.json'} is missing or has a bad value for {exc}.") from exc


def generation_defaults(folder: Path, config: ModelConfig) -> dict[str, Any]:
    """Sampling defaults from generation_config.json; its eos_token_id(s) are added to `config`."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return {}
    raw = _read_json(path)
    eos = raw.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    config.eos_token_ids = list(dict.fromkeys([*config.eos_token_ids, *(int(e) for e in eos_ids)]))
    return {key: raw[key] for key in _GENERATION_KEYS if raw.get(key) is not None}


def safetensors_files(folder: Path, quantized: bool = False) -> list[SafetensorsFile]:
    """The folder's weight files (sharded through model.safetensors.index.json, or single), headers parsed;
    `quantized` (a quantization_config, see hf_quant) admits int32/int8/fp8 storage too."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map") or {}
        names = list(dict.fromkeys(weight_map.values()))
    elif (folder / "model.safetensors").is_file():
        names = ["model.safetensors"]
    else:
        names = sorted(p.name for p in folder.glob("model*.safetensors"))
    if not names:
        raise ModelLoadError(
            f"{folder} has no model.safetensors (or model.safetensors.index.json). Only safetensors "
            "weights are supported; convert .bin/.pt checkpoints with transformers' save_pretrained."
        )
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ModelLoadError(
            f"{folder} lacks weight shard(s) {', '.join(missing)}; the download is incomplete."
        )
    return [_read_header(folder / n, quantized) for n in names]


def _read_header(path: Path, quantized: bool = False) -> SafetensorsFile:
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > path.stat().st_size:
                raise ValueError("header length is past the end of the file")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"{path} is not a valid safetensors file ({exc}).") from exc
    header.pop("__metadata__", None)
    for name, info in header.items():
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if (
            dtype not in _DTYPES
            and not _mxfp4_part(name, dtype)
            and not (quantized and dtype in QUANT_STORAGE)
        ):
            raise ModelLoadError(
                f"{path.name}: tensor {name} has dtype {dtype}; only F32, F16 and BF16 "
                "safetensors are supported (for quantized models use a GGUF file)."
            )
    return SafetensorsFile(path=path, header=header, data_start=8 + length)


def _mxfp4_part(name: str, dtype: object) -> bool:
    """gpt-oss's MXFP4 experts: uint8 codes and scales, dequantized by the family's sanitize."""
    return dtype == "U8" and name.endswith(("_blocks", "_scales"))


def checkpoint_prefixes(folder: Path) -> dict[str, str | None]:
    """The registry's name prefix map for the folder's (outer) model_type: empty unless it wraps a text LM."""
    arch = ARCHITECTURES.get(str(_read_json(folder / "config.json").get("model_type", "")))
    return dict(arch.weight_prefixes) if arch is not None else {}


def iter_safetensors_weights(
    files: list[SafetensorsFile], prefixes: dict[str, str | None] | None = None
) -> Iterator[WeightTensor]:
    """Every tensor once, as a read-only view into the memory-mapped file; names through `prefixes`
    (`checkpoint_prefixes`), skipping those mapped to None."""
    for file in files:
        mapped = np.memmap(file.path, dtype=np.uint8, mode="r")
        for stored, info in file.header.items():
            name = renamed(stored, prefixes or {})
            if name is None:
                continue
            np_dtype, dtype = _DTYPES.get(info["dtype"], (np.uint8, "U8"))  # U8: MXFP4 parts
            if info["dtype"] in QUANT_STORAGE:  # a quantized checkpoint's parts, for hf_quant
                np_dtype, dtype = QUANT_STORAGE[info["dtype"]], info["dtype"]
            begin, end = info["data_offsets"]
            shape = tuple(int(d) for d in info["shape"])
            raw = mapped[file.data_start + begin : file.data_start + end]
            yield WeightTensor(name=name, shape=shape, dtype=dtype, data=raw.view(np_dtype).reshape(shape))


def renamed(name: str, prefixes: dict[str, str | None]) -> str | None:
    for prefix, replacement in prefixes.items():
        if name.startswith(prefix):
            return None if replacement is None else replacement + name[len(prefix) :]
    return name
