"""Whether a model folder takes images, read from its config.json alone (no torch): the server can say so
in its model info and refuse pictures for text-only models before anything reaches the engine."""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path
from typing import Any

from localchat.errors import ModelLoadError

# Multimodal families whose vision tower localchat runs (backends/torch/vision/).
SUPPORTED = frozenset(
    {
        "gemma3",
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_5",
        "qwen3_5_moe",
        "llava",
        "llava_next",
        "smolvlm",
        "idefics3",
        "mistral3",
        "gemma4",
        "llama4",
    }
)

# The text models a Mistral3ForConditionalGeneration wraps whose localchat families take image rows
# (Mistral Small 3.x: mistral; Ministral 3: ministral3; Mistral Small 4: mistral4).
PIXTRAL_TEXT_TYPES = frozenset({"mistral", "llama", "ministral", "ministral3", "mistral4"})


def vision_config(path: Path) -> dict[str, Any] | None:
    """The config.json of a multimodal safetensors folder of a supported family (for a GGUF file: the same
    dict built from its paired mmproj), else None."""
    if path.suffix.lower() == ".gguf" and path.is_file():
        from localchat.vision.mmproj import paired_vision_config  # a text GGUF + llama.cpp's mmproj

        return paired_vision_config(path)
    config_file = path / "config.json"
    if not path.is_dir() or not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if not isinstance(config, dict) or config.get("model_type") not in SUPPORTED:
        return None
    text_type = (config.get("text_config") or {}).get("model_type", "mistral")
    if config["model_type"] == "mistral3" and text_type not in PIXTRAL_TEXT_TYPES:
        return None
    if config.get("vision_config") is None:  # Gemma 4 may save it as null
        return None
    # A text-only export keeps the multimodal config but drops the tower: it runs text, and must say so.
    return config if holds_vision_weights(path) else None


# Names a multimodal checkpoint gives its tower's (and projector's) tensors, across the supported families.
_VISION_KEY_PARTS = ("vision", "visual.", "multi_modal_projector")


def holds_vision_weights(folder: Path) -> bool:
    """Whether the folder's safetensors name any vision tensor, read from the index or the files' JSON
    headers (a few KiB each; no tensor data is read). A folder with no weights yet (still downloading)
    goes by its config. Listings and requests ask again and again: the answer is kept per weight-file
    set (names, sizes, mtimes), so only a changed folder is read again."""
    index = folder / "model.safetensors.index.json"
    files = [index] if index.is_file() else sorted(folder.glob("*.safetensors"))
    if not files:
        return True
    stamps = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _names_vision_tensors(stamps)


@functools.lru_cache(maxsize=256)
def _names_vision_tensors(stamps: tuple[tuple[str, int, int], ...]) -> bool:
    for name, _, _ in stamps:
        file = Path(name)
        if file.suffix == ".json":  # the index of a sharded folder
            names = list(json.loads(file.read_text()).get("weight_map", {}))
        else:
            with file.open("rb") as handle:
                (size,) = struct.unpack("<Q", handle.read(8))
                names = list(json.loads(handle.read(size)))
        if any(part in tensor for tensor in names for part in _VISION_KEY_PARTS):
            return True
    return False


def takes_images(path: Path) -> bool:
    """For listings (/v1/models, the model picker): an unreadable config.json counts as no vision."""
    try:
        return vision_config(path) is not None
    except (OSError, ValueError, ModelLoadError):  # a mismatched mmproj too: the load says why
        return False
