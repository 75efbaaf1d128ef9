"""Single-file GGUF models: metadata -> ModelConfig, tensors -> WeightTensors under Hugging Face names.

The file stays memory-mapped (gguf.GGUFReader). Quantized tensors are handed over as their raw blocks,
one row of blocks per output feature, so a backend may keep them quantized or call `dequantize()`.
"""

from __future__ import annotations

import contextlib
import mmap
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor

from localchat.arch.architecture import Architecture
from localchat.arch.registry import ARCHITECTURES, GGUF_ARCHITECTURES, SUPPORTED_MODEL_TYPES
from localchat.errors import ModelLoadError, UnsupportedArchitectureError
from localchat.weights.config import ModelConfig
from localchat.weights.gguf_check import check_gguf_layout
from localchat.weights.gguf_rope import llama3_scaling_from_factors
from localchat.weights.tensors import WeightTensor

_DENSE = {GGMLQuantizationType.F32: "F32", GGMLQuantizationType.F16: "F16", GGMLQuantizationType.BF16: "BF16"}
_NOT_WEIGHTS = {GGMLQuantizationType[n] for n in ("I8", "I16", "I32", "I64", "F64")}

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "token_embd_norm": "model.embedding_norm",  # LFM2's final norm (its checkpoint's name)
    # Gemma 4's per-layer embeddings (E2B / E4B).
    "per_layer_token_embd": "model.embed_tokens_per_layer",
    "per_layer_model_proj": "model.per_layer_model_projection",
    "per_layer_proj_norm": "model.per_layer_projection_norm",
}
# Tensors llama.cpp adds that have no HF counterpart; their content is read into the config instead.
_SKIPPED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
# {arch}.rope.scaling.* -> the HF rope_scaling key that means the same.
_ROPE_EXTRA_KEYS = {
    "original_context_length": "original_max_position_embeddings",
    "yarn_beta_fast": "beta_fast",
    "yarn_beta_slow": "beta_slow",
}
# A part may have one dotted step (LFM2's `shortconv.conv`) and no suffix (the hybrids' bare `ssm_a`).
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([A-Za-z_]\w*(?:\.(?!weight$|bias$)[A-Za-z_]\w*)?)(?:\.(weight|bias))?")
# Files converted before llama.cpp stacked experts (early 2024 Mixtral GGUFs): one tensor per expert.
_EXPERT_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(\d+)\.weight")
# GLM-4.5's multi-token-prediction block (llama.cpp counts it in block_count): not run, not loaded.
_NEXTN_RE = re.compile(r"blk\.\d+\.nextn\.")


class _Reader(GGUFReader):
    """GGUFReader whose slices are plain ndarray views of the same read-only mapping.

    NOTE: np.memmap slices pay a Python-level __array_finalize__ each, and the reader takes one per
    metadata string (~100k for a 50k vocabulary): plain views make opening SmolLM2 ~2.5x faster.
    """

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.memmap) -> None:
        self._mapped = mapped  # keeps the mapping alive
        self._plain = mapped.view(np.ndarray)


def open_gguf(path: Path) -> GGUFReader:
    """Memory-map a GGUF file, turning every way it can fail into a ModelLoadError."""
    if not path.is_file():
        raise ModelLoadError(f"Model file {path} does not exist.")
    try:
        check_gguf_layout(path)  # sizes and counts first: the reader trusts them
        return _Reader(path)
    except (ValueError, OSError, IndexError, KeyError, OverflowError) as exc:
        raise ModelLoadError(
            f"{path} is not a readable GGUF file ({exc}). If it is a .gguf model, download it again."
        ) from exc


def gguf_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value as plain Python (str, int, float, bool or list), or `default`."""
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except (UnicodeDecodeError, ValueError, IndexError) as exc:
        raise ModelLoadError(
            f"GGUF metadata {key!r} cannot be read ({exc}): the file is damaged. Download it again."
        ) from exc


def _f32(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def gguf_architecture(reader: GGUFReader) -> Architecture:
    """The registry entry for the file's `general.architecture` (llama.cpp's name for it), or the one it
    names for files of that architecture with experts."""
    arch = str(gguf_value(reader, "general.architecture", ""))
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedArchitectureError(arch, list(SUPPORTED_MODEL_TYPES))
    entry = GGUF_ARCHITECTURES[arch]
    if entry.gguf_experts_model_type and int(gguf_value(reader, f"{arch}.expert_count", 0) or 0) > 0:
        return ARCHITECTURES[entry.gguf_experts_model_type]
    return entry


def hf_tensor_name(gguf_name: str, arch: Architecture) -> str | None:
    """The Hugging Face name for a llama.cpp tensor name, or None when it has no counterpart."""
    if gguf_name in _SKIPPED or (_NEXTN_RE.match(gguf_name) and not _family_reads(gguf_name, arch)):
        return None  # a multi-token-prediction block's own tensors, unless the family reads them
    if match := _BLOCK_RE.fullmatch(gguf_name):
        layer, part, kind = match.groups()
        if part in arch.gguf_block_names:
            stem = f"model.layers.{layer}.{arch.gguf_block_names[part]}"
            return f"{stem}.{kind}" if kind else stem
    elif match := _EXPERT_RE.fullmatch(gguf_name):
        layer, part, expert = match.groups()
        if part in arch.gguf_expert_names:
            return f"model.layers.{layer}.{arch.gguf_expert_names[part].format(e=expert)}.weight"
    else:
        stem, _, kind = gguf_name.rpartition(".")
        if stem in _GLOBAL_NAMES and kind in ("weight", "bias"):
            return f"{_GLOBAL_NAMES[stem]}.{kind}"
    raise ModelLoadError(
        f"GGUF tensor {gguf_name!r} is not part of a supported model; the file may be damaged."
    )


def _family_reads(gguf_name: str, arch: Architecture) -> bool:
    """Whether the family maps this block tensor (Qwen3.5 / Qwen3-Next map their MTP block's `nextn.*`)."""
    match = _BLOCK_RE.fullmatch(gguf_name)
    return match is not None and match.group(2) in arch.gguf_block_names


def config_from_gguf(reader: GGUFReader) -> ModelConfig:
    entry = gguf_architecture(reader)
    arch = str(gguf_value(reader, "general.architecture"))  # the metadata prefix, also for Mixtral's "llama"

    def get(key: str, default: Any = None) -> Any:
        return gguf_value(reader, f"{arch}.{key}", default)

    if entry.gguf_hf_config is not None:
        return _config_from_family_reader(reader, entry, get)
    try:
        hidden = int(get("embedding_length"))
        heads = int(get("attention.head_count"))
        layers = int(get("block_count"))
        ffn = _largest(get("feed_forward_length"))
    except TypeError as exc:  # int(None): a required key is missing
        raise ModelLoadError(f"GGUF metadata for {arch!r} lacks a required model size ({exc}).") from exc
    names = {t.name for t in reader.tensors}
    vocab = get("vocab_size") or len(gguf_value(reader, "tokenizer.ggml.tokens", []))
    theta = _f32(get("rope.freq_base", 10000.0))
    head_dim = int(get("attention.key_length") or hidden // heads)
    bos = gguf_value(reader, "tokenizer.ggml.bos_token_id")
    eos = [gguf_value(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    return ModelConfig(
        model_type=entry.model_type,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=_kv_heads(get("attention.head_count_kv"), heads),
        head_dim=head_dim,
        rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=theta,
        rope_scaling=_rope_scaling(reader, arch, theta, head_dim, entry.gguf_yarn_log_mul_per_mscale),
        partial_rotary_factor=int(get("rope.dimension_count") or head_dim) / head_dim,
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        sliding_window=get("attention.sliding_window"),
        attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=list(dict.fromkeys(int(e) for e in eos if e is not None)),
        torch_dtype=None,  # a GGUF mixes tensor types; the backend picks its compute dtype
        extra=_extra(entry, get, layers, hidden // heads, "blk.0.attn_q_norm.weight" in names),
    )


def _largest(value: Any) -> int:
    """A size some hybrids write per layer (Nemotron-H's MLP width, 0 where a layer has none)."""
    return max((int(v) for v in value), default=0) if isinstance(value, list) else int(value)


def _kv_heads(value: Any, heads: int) -> int:
    """Hybrids write one count per layer (0 for the layers without attention): the attention layers'."""
    if isinstance(value, list):
        return max((int(v) for v in value), default=0) or heads
    return int(value or heads)


def _config_from_family_reader(
    reader: GGUFReader, entry: Architecture, get: Callable[..., Any]
) -> ModelConfig:
    """The family's own reading of its metadata (`Architecture.gguf_hf_config`), as a config.json."""
    assert entry.gguf_hf_config is not None
    tensors = {t.name: t for t in reader.tensors}
    shapes = {n: tuple(int(d) for d in reversed(t.shape.tolist())) for n, t in tensors.items()}

    def values(name: str) -> np.ndarray | None:
        tensor = tensors.get(name)
        return None if tensor is None else np.asarray(tensor.data, dtype=np.float32).reshape(-1)

    eos = [gguf_value(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    try:
        keys = entry.gguf_hf_config(get, shapes, values)
    except (KeyError, TypeError, ValueError, IndexError) as exc:  # a key missing or of the wrong kind
        raise ModelLoadError(
            f"GGUF metadata for {entry.gguf_arch!r} lacks or garbles a model setting ({exc!r}); the file is "
            "damaged or from a converter localchat does not know."
        ) from exc
    tokens = {
        "bos_token_id": gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(dict.fromkeys(int(e) for e in eos if e is not None)),
    }
    return ModelConfig.from_hf_dict({**keys, **tokens, "model_type": entry.model_type, "torch_dtype": None})


def _extra(
    entry: Architecture,
    get: Callable[[str], Any],
    layers: int,
    width_per_head: int,
    has_qk_norm: bool = False,
) -> dict[str, Any]:
    """The registry's extra keys, overridden by the GGUF metadata that records them."""
    extra = {
        **entry.extra_keys,
        **{hf_key: value for key, hf_key in entry.gguf_metadata.items() if (value := get(key)) is not None},
    }
    if "use_qk_norm" in extra:  # an option the file records by carrying the tensors (GLM-4.5)
        extra["use_qk_norm"] = has_qk_norm
    if entry.gguf_wide_query_scale_layers == layers and extra.get("query_pre_attn_scalar") is None:
        extra["query_pre_attn_scalar"] = width_per_head  # llama.cpp's Gemma 27B rule (registry)
    return extra


def _rope_scaling(
    reader: GGUFReader, arch: str, theta: float, head_dim: int, log_mul_per_mscale: float = 1.0
) -> dict[str, Any] | None:
    kind = gguf_value(reader, f"{arch}.rope.scaling.type")
    if kind in ("linear", "yarn"):
        factor = _f32(gguf_value(reader, f"{arch}.rope.scaling.factor", 1.0))
        scaling: dict[str, Any] = {"rope_type": kind, "factor": factor}
        for key, hf_key in _ROPE_EXTRA_KEYS.items():
            if (value := gguf_value(reader, f"{arch}.rope.scaling.{key}")) is not None:
                scaling[hf_key] = value
        if (log_mul := gguf_value(reader, f"{arch}.rope.scaling.yarn_log_multiplier")) is not None:
            # llama.cpp's yarn attention factor from it assumes mscale 1: transformers' form of that.
            # DeepSeek's converter writes 0.1 * mscale_all_dim and means mscale == mscale_all_dim.
            if log_mul_per_mscale == 1.0:
                scaling.update(mscale=1.0, mscale_all_dim=_f32(log_mul))
            else:
                mscale = round(_f32(log_mul) / log_mul_per_mscale, 6)
                scaling.update(mscale=mscale, mscale_all_dim=mscale)
        return scaling
    # longrope (Phi-3): the factor lists are tensors, the rest metadata.
    lists = {t.name: t for t in reader.tensors if t.name.startswith("rope_factors_")}
    if "rope_factors_long.weight" in lists and "rope_factors_short.weight" in lists:
        scaling = {
            "rope_type": "longrope",
            "long_factor": np.asarray(lists["rope_factors_long.weight"].data, dtype=np.float32).tolist(),
            "short_factor": np.asarray(lists["rope_factors_short.weight"].data, dtype=np.float32).tolist(),
        }
        if (original := gguf_value(reader, f"{arch}.rope.scaling.original_context_length")) is not None:
            scaling["original_max_position_embeddings"] = int(original)
        if (attn_factor := gguf_value(reader, f"{arch}.rope.scaling.attn_factor")) is not None:
            scaling["attention_factor"] = _f32(attn_factor)
        return scaling
    # Llama 3.1-style scaling has no metadata key: the converter stores per-frequency factors instead.
    factors = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if factors is not None:
        return llama3_scaling_from_factors(np.asarray(factors.data, dtype=np.float64), theta, head_dim)
    return None


def _unpermute_rows(data: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row interleave so rows follow HF's rotate-half layout.

    Within each head the file stores HF rows i and i + head_dim/2 next to each other (as rows 2i, 2i+1),
    the layout llama.cpp's rope kernel wants. Only whole rows move, so quantized rows work the same.
    """
    rows = data.shape[0]
    half = rows // n_heads // 2
    tail = data.shape[1:]
    # [heads, half, 2, ...] -> [heads, 2, half, ...]
    return np.ascontiguousarray(data.reshape(n_heads, half, 2, *tail).swapaxes(1, 2)).reshape(rows, *tail)


def iter_gguf_weights(reader: GGUFReader, config: ModelConfig) -> Iterator[WeightTensor]:
    """Every model tensor once, under its HF name, in the file's order."""
    arch = gguf_architecture(reader)
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name, arch)
        if name is None:
            continue
        qtype = tensor.tensor_type
        if qtype in _NOT_WEIGHTS:
            raise ModelLoadError(
                f"GGUF tensor {tensor.name} has type {qtype.name}, which is not a weight type."
            )
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
        try:
            dtype, data = _tensor_data(tensor, shape, config, name, arch.gguf_permuted_qk)
            if arch.gguf_norm_offset and name.endswith("norm.weight") and dtype in ("F32", "F16"):
                dtype, data = "F32", data.astype(np.float32) - np.float32(arch.gguf_norm_offset)
        except (ValueError, ZeroDivisionError) as exc:  # shapes that contradict the sizes or the config
            raise ModelLoadError(
                f"GGUF tensor {tensor.name} has shape {list(shape)}, which its data or the model's "
                f"config contradicts ({exc}): the file is damaged. Download it again."
            ) from exc
        yield WeightTensor(name=name, shape=shape, dtype=dtype, data=data)
        _forget_pages(reader, tensor)


def _tensor_data(
    tensor: ReaderTensor, shape: tuple[int, ...], config: ModelConfig, name: str, permuted: bool
) -> tuple[str, np.ndarray]:
    qtype = tensor.tensor_type
    if qtype in _DENSE:
        dtype = _DENSE[qtype]
        data = tensor.data.view(np.uint16) if qtype == GGMLQuantizationType.BF16 else tensor.data
        data = data.reshape(shape)
    else:
        dtype = qtype.name
        block, nbytes = GGML_QUANT_SIZES[qtype]
        data = tensor.data.reshape(-1, shape[-1] // block * nbytes)  # [rows, bytes_per_row]
    if permuted and (".q_proj." in name or ".k_proj." in name):
        heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
        data = _unpermute_rows(data, heads)
    return dtype, data


def _forget_pages(reader: GGUFReader, tensor: ReaderTensor) -> None:
    """Once the consumer moved on, take the tensor's file pages out of this process's resident set
    (the page cache keeps them; a later read faults them back in from the file, so views stay valid).
    Without this a load holds the whole file resident on top of the converted weights (+98 MiB peak for
    SmolLM2)."""
    mapped = getattr(getattr(reader, "_mapped", None), "_mmap", None)
    if mapped is None or not hasattr(mapped, "madvise"):
        return
    start = tensor.data_offset // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(tensor.data_offset + tensor.n_bytes, len(mapped))
    with contextlib.suppress(OSError, ValueError):
        mapped.madvise(mmap.MADV_DONTNEED, start, end - start)


def check_gguf_tensors(reader: GGUFReader) -> None:
    """Fail at load time, not halfway through a backend's weight loading."""
    arch = gguf_architecture(reader)
    for tensor in reader.tensors:
        hf_tensor_name(tensor.name, arch)
    if not any(t.name == "token_embd.weight" for t in reader.tensors):
        raise ModelLoadError("The GGUF file has no token_embd.weight tensor; it holds no complete model.")


def gguf_chat_template(reader: GGUFReader) -> str | None:
    template = gguf_value(reader, "tokenizer.chat_template")
    return str(template) if template else None
