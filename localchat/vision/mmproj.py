"""llama.cpp's vision projector files (`mmproj-*.gguf`: `clip.*` metadata, `v.*` / `mm.*` tensors) paired
with a text GGUF, without torch. A Gemma 3 GGUF with its mmproj is a vision model: its pairing (an explicit
--mmproj, else the only `mmproj*.gguf` beside the model file) gives the same config dict a Gemma 3
safetensors folder's config.json gives (localchat.vision.model_info), so the prompt and runner sides
treat both alike."""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from localchat.errors import ModelLoadError
from localchat.vision.gemma4_mmproj import IMAGE as GEMMA4_IMAGE
from localchat.vision.gemma4_mmproj import gemma4_config
from localchat.vision.llama4_mmproj import PATCH as LLAMA4_PATCH
from localchat.vision.llama4_mmproj import llama4_config
from localchat.vision.pixtral_mmproj import IMAGE as PIXTRAL_IMAGE
from localchat.vision.pixtral_mmproj import PIXTRAL_TEXT_ARCHS, pixtral_config
from localchat.vision.qwen_vl_mmproj import QWEN_VL_TEXT_ARCHS, pairs_with, qwen_vl_config
from localchat.vision.qwen_vl_prompt import IMAGE_PAD
from localchat.vision.smolvlm_mmproj import smolvlm_config

log = logging.getLogger(__name__)

# Projector kinds whose tower localchat runs, by the text architecture they feed.
# `mlp`: LLaVA 1.5 and its fine-tunes (CLIP tower + 2-layer MLP), written by llama.cpp's
# convert_image_encoder_to_gguf.py; their text models are llama GGUFs.
# `pixtral`: Mistral Small 3.x (Pixtral tower + Mistral 3 projector), `mistral3` GGUFs (older: `llama`).
PROJECTORS = {"gemma3": "gemma3", "mlp": "llama", "pixtral": "mistral3", **QWEN_VL_TEXT_ARCHS}
# `gemma4v`: Gemma 4 (llama.cpp writes vision + audio in one file; the audio side is not run).
PROJECTORS["gemma4v"] = "gemma4"
# The placeholder token each kind's prompt repeats per image row.
IMAGE_TOKENS = {
    "gemma3": "<image_soft_token>",
    "mlp": "<image>",
    "pixtral": PIXTRAL_IMAGE,
    **dict.fromkeys(QWEN_VL_TEXT_ARCHS, IMAGE_PAD),
}

IMAGE_TOKENS["gemma4v"] = GEMMA4_IMAGE

# `idefics3`: SmolVLM / Idefics3 (SigLIP tower + pixel-shuffle connector), written by convert_hf_to_gguf.py
# --mmproj; their text models are llama GGUFs.
PROJECTORS["idefics3"] = "llama"
IMAGE_TOKENS["idefics3"] = "<image>"
# `llama4`: Llama 4 (tower + pixel-shuffle adapter + projector), written by convert_hf_to_gguf.py --mmproj.
PROJECTORS["llama4"] = "llama4"
IMAGE_TOKENS["llama4"] = LLAMA4_PATCH

# --mmproj choices made at load time, by model file: listings and the prompt side find them here.
_explicit: dict[Path, Path] = {}


class MmprojMismatchError(ModelLoadError):
    """An mmproj that cannot feed the text model it is paired with."""

    code = "mmproj_mismatch"


def is_mmproj_name(name: str) -> bool:
    """How llama.cpp's converter and the hub repos name projector files."""
    lower = name.lower()
    return lower.endswith(".gguf") and "mmproj" in lower


def pair_mmproj(model_file: Path, explicit: str | Path | None = None) -> Path | None:
    """The projector for a text GGUF: `explicit` (remembered for later lookups), else exactly one
    `mmproj*.gguf` in the model's folder; None when there is none or several (then which one is unclear).
    The folder is the path's own, links unresolved: a pulled model is a link into the HF cache's blobs."""
    model_file = model_file.expanduser().absolute()
    if explicit is not None:
        chosen = Path(explicit).expanduser().resolve()
        if not chosen.is_file():
            raise ModelLoadError(f"--mmproj {chosen} does not exist. Give the path of an mmproj-*.gguf file.")
        _explicit[model_file] = chosen
        return chosen
    if model_file in _explicit:
        return _explicit[model_file]
    found = sorted(p for p in model_file.parent.glob("*.gguf") if is_mmproj_name(p.name))
    return found[0] if len(found) == 1 else None


def _reader(path: Path) -> Any:
    from localchat.weights.gguf import open_gguf  # the gguf package's reader, with our error handling

    return open_gguf(path)


def _value(reader: Any, key: str, default: Any = None) -> Any:
    from localchat.weights.gguf import gguf_value

    return gguf_value(reader, key, default)


@lru_cache(maxsize=16)
def _mmproj_metadata(path: Path, mtime_ns: int) -> dict[str, Any]:
    reader = _reader(path)
    keys = ("clip.projector_type", "clip.vision.projection_dim", "clip.vision.image_size",
            "clip.vision.patch_size", "clip.vision.embedding_length", "clip.vision.feed_forward_length",
            "clip.vision.block_count", "clip.vision.attention.head_count",
            "clip.vision.attention.layer_norm_epsilon", "clip.vision.projector.scale_factor",
            "clip.vision.image_mean", "clip.vision.image_std", "clip.use_gelu",
            "clip.vision.feature_layer", "clip.vision.image_grid_pinpoints",
            "clip.vision.spatial_merge_size", "clip.vision.n_wa_pattern", "clip.vision.is_deepstack_layers",
            "clip.vision.image_min_pixels", "clip.vision.image_max_pixels", "clip.use_silu")  # fmt: skip
    meta = {key: _value(reader, key) for key in keys}
    # SmolVLM's longest edge, before tiling
    meta["clip.vision.preproc_image_size"] = _value(reader, "clip.vision.preproc_image_size")
    # a vision + audio projector file (Gemma 4) types each side under its own key
    meta["clip.projector_type"] = meta["clip.projector_type"] or _value(reader, "clip.vision.projector_type")
    # the projector's matrices' shapes (ne order: input width first): the output width is the text's
    meta["tensors"] = {t.name: [int(d) for d in t.shape] for t in reader.tensors if t.name.startswith("mm.")}
    if not _value(reader, "clip.has_vision_encoder", False) or meta["clip.projector_type"] is None:
        raise ModelLoadError(f"{path} is not a vision projector (no clip.* vision metadata).")
    return meta


@lru_cache(maxsize=16)
def _text_metadata(path: Path, mtime_ns: int) -> tuple[str, int, dict[str, int]]:
    """(architecture, hidden size, ids of the image placeholder tokens it has) of a text GGUF."""
    reader = _reader(path)
    arch = str(_value(reader, "general.architecture", ""))
    hidden = int(_value(reader, f"{arch}.embedding_length", 0))
    tokens = _value(reader, "tokenizer.ggml.tokens", []) or []
    markers = set(IMAGE_TOKENS.values())
    return arch, hidden, {token: i for i, token in enumerate(tokens) if token in markers}


def mmproj_metadata(path: Path) -> dict[str, Any]:
    return _mmproj_metadata(path, path.stat().st_mtime_ns)


def gguf_vision_config(model_file: Path, mmproj: Path) -> dict[str, Any]:
    """The config.json-shaped dict (model_type, vision_config, text_config, mm_tokens_per_image,
    image_token_index) of a text GGUF + its mmproj; MmprojMismatchError when they do not fit."""
    meta = mmproj_metadata(mmproj)
    arch, hidden, image_tokens = _text_metadata(model_file, model_file.stat().st_mtime_ns)
    kind = str(meta["clip.projector_type"])
    if (
        PROJECTORS.get(kind) != arch
        and not pairs_with(kind, arch)
        and not (kind == "pixtral" and arch in PIXTRAL_TEXT_ARCHS)
    ):
        raise MmprojMismatchError(
            f"The vision projector {mmproj.name} is of kind {kind!r}, but the model {model_file.name} is "
            f"{arch!r}: localchat pairs {', '.join(f'{k} projectors with {a}' for k, a in PROJECTORS.items())}. "
            "Use the mmproj file published with this model (--mmproj PATH)."
        )
    width = (
        meta["tensors"].get("mm.2.weight", [0])[-1] if kind == "mlp" else meta["clip.vision.projection_dim"]
    )
    if int(width or 0) != hidden:
        raise MmprojMismatchError(
            f"The vision projector {mmproj.name} writes embeddings of width "
            f"{width}, but the model {model_file.name} has hidden size {hidden}. "
            "Use the mmproj file published with this model (--mmproj PATH)."
        )
    image_token = image_tokens.get(IMAGE_TOKENS[kind])
    if image_token is None:
        raise MmprojMismatchError(
            f"{model_file.name} has no {IMAGE_TOKENS[kind]} token in its vocabulary, so a prompt cannot "
            "mark where a picture goes. Use a GGUF converted from the transformers checkpoint (it keeps "
            "the token)."
        )
    if kind == "idefics3":
        return smolvlm_config(meta, hidden, image_token, mmproj)
    if kind == "mlp":
        return _llava_config(meta, hidden, image_token, mmproj)
    if kind == "pixtral":  # the projector's RMSNorm takes the text model's epsilon, as transformers does
        eps = float(_value(_reader(model_file), f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
        return pixtral_config(meta, hidden, eps, image_token, mmproj)
    if kind == "gemma4v":  # the tower's shape is read off its tensors
        return gemma4_config(meta, mmproj, _reader(mmproj).tensors, hidden, image_token)
    if kind == "llama4":  # the adapter's widths are read off its tensors
        return llama4_config(meta, hidden, image_token, mmproj)
    if kind in QWEN_VL_TEXT_ARCHS:
        return qwen_vl_config(meta, arch, hidden, image_token, mmproj)
    size, patch = int(meta["clip.vision.image_size"]), int(meta["clip.vision.patch_size"])
    scale = int(meta["clip.vision.projector.scale_factor"] or 4)  # llama.cpp's default for Gemma 3
    eps = meta["clip.vision.attention.layer_norm_epsilon"]
    return {
        "model_type": arch,
        "mm_tokens_per_image": (size // patch // scale) ** 2,
        "image_token_index": image_token,
        "text_config": {"hidden_size": hidden},
        "vision_config": {
            "hidden_size": int(meta["clip.vision.embedding_length"]),
            "intermediate_size": int(meta["clip.vision.feed_forward_length"]),
            "num_hidden_layers": int(meta["clip.vision.block_count"]),
            "num_attention_heads": int(meta["clip.vision.attention.head_count"]),
            "image_size": size,
            "patch_size": patch,
            "layer_norm_eps": float(eps) if eps is not None else 1e-6,
        },
        "mmproj": str(mmproj),
    }


def paired_vision_config(model_file: Path) -> dict[str, Any] | None:
    """The vision config of a text GGUF whose mmproj is paired, else None. A projector found beside the
    model (not named by --mmproj) whose kind localchat does not run leaves the model text-only: a
    Qwen2.5-VL GGUF still chats, and so does a LLaVA GGUF whose vocabulary has no `<image>` token (the
    legacy conversions); a wrong projector of a kind we run is an error."""
    model_file = model_file.expanduser().absolute()
    mmproj = pair_mmproj(model_file)
    if mmproj is None:
        return None
    kind = mmproj_metadata(mmproj)["clip.projector_type"]
    if model_file not in _explicit and kind not in PROJECTORS:
        return None
    if model_file not in _explicit and kind == "mlp":
        tokens = _text_metadata(model_file, model_file.stat().st_mtime_ns)[2]
        if IMAGE_TOKENS[kind] not in tokens:
            log.warning("%s has no <image> token: %s is not paired, images unsupported", model_file, mmproj)
            return None
    return gguf_vision_config(model_file, mmproj)


def _llava_config(meta: dict[str, Any], hidden: int, image_token: int, mmproj: Path) -> dict[str, Any]:
    """A LlavaForConditionalGeneration-shaped config: llama.cpp's converter keeps only the tower's layers
    up to the feature layer (the last one stored, unless it records `feature_layer`, indices into
    [embeddings, layer 1, ...]) and drops the CLS row."""
    blocks = int(meta["clip.vision.block_count"])
    layers = meta["clip.vision.feature_layer"] or [blocks]
    eps = meta["clip.vision.attention.layer_norm_epsilon"]
    preprocessing = {
        key: [float(v) for v in meta[f"clip.vision.{key}"]]
        for key in ("image_mean", "image_std")
        if meta[f"clip.vision.{key}"]
    }
    # LLaVA-NeXT (1.6): the flattened (height, width) tile grid, and its image_newline tensor
    pinpoints = [int(v) for v in meta["clip.vision.image_grid_pinpoints"] or []]
    anyres = {"image_grid_pinpoints": [pinpoints[i : i + 2] for i in range(0, len(pinpoints), 2)]}
    return {
        "model_type": "llava_next" if pinpoints else "llava",
        **(anyres if pinpoints else {}),
        "image_token_index": image_token,
        "vision_feature_layer": [int(i) for i in layers],
        "vision_feature_select_strategy": "default",
        "projector_hidden_act": "gelu",
        "text_config": {"hidden_size": hidden},
        "vision_config": {
            "hidden_size": int(meta["clip.vision.embedding_length"]),
            "intermediate_size": int(meta["clip.vision.feed_forward_length"]),
            "num_hidden_layers": blocks,
            "num_attention_heads": int(meta["clip.vision.attention.head_count"]),
            "image_size": int(meta["clip.vision.image_size"]),
            "patch_size": int(meta["clip.vision.patch_size"]),
            "layer_norm_eps": float(eps) if eps is not None else 1e-5,
            "hidden_act": "gelu" if meta["clip.use_gelu"] else "quick_gelu",
        },
        "preprocessing": preprocessing,
        "mmproj": str(mmproj),
    }
