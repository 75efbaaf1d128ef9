"""Model classes by Hugging Face `model_type`: the registry names the family module that computes it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from localchat.arch.registry import architecture

if TYPE_CHECKING:
    from localchat.backends.mlx.models.base import DecoderLM


def model_class(model_type: str) -> type[DecoderLM]:
    family = architecture(model_type).family
    return importlib.import_module(f"localchat.backends.mlx.models.{family}").Model
