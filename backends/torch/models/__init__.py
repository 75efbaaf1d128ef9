"""Architecture registry: Hugging Face `model_type` -> the module defining its `Model` class."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from localchat.errors import UnsupportedArchitectureError

if TYPE_CHECKING:
    from backends.torch.models.base import DecoderLM

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def model_class(model_type: str) -> type[DecoderLM]:
    if model_type not in MODEL_TYPES:
        raise UnsupportedArchitectureError(model_type, list(MODEL_TYPES))
    return importlib.import_module(f"backends.torch.models.{model_type}").Model
