"""Model classes by Hugging Face `model_type`: the registry names the family module that computes it."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from localchat.arch.registry import ARCHITECTURES, architecture
from localchat.errors import UnsupportedArchitectureError

if TYPE_CHECKING:
    from localchat.backends.mlx.models.base import DecoderLM


def model_class(model_type: str) -> type[DecoderLM]:
    if not _built(architecture(model_type).family):  # a family built for the torch backend only (so far)
        mlx_types = [t for t, a in ARCHITECTURES.items() if _built(a.family)]
        raise UnsupportedArchitectureError(
            f"{model_type} on the MLX backend (use --backend torch)", mlx_types
        )
    return importlib.import_module(f"localchat.backends.mlx.models.{architecture(model_type).family}").Model


def _built(family: str) -> bool:
    return importlib.util.find_spec(f"localchat.backends.mlx.models.{family}") is not None
