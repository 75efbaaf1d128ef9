"""What loading a model yields: config, lazily read weights, tokenizer, chat template, defaults."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.tokenizer import Tokenizer


@dataclass(slots=True)
class ModelBundle:
    name: str  # the id shown in /v1/models
    path: Path
    format: Literal["safetensors", "gguf", "none"]
    config: ModelConfig
    # Called by the runner; yields each weight once, memory-mapped where the format allows.
    iter_weights: Callable[[], Iterator[WeightTensor]]
    tokenizer: Tokenizer
    chat_template: str | None = None
    # Sampling defaults from generation_config.json (temperature, top_p, top_k, ...), when present.
    generation_defaults: dict[str, Any] = field(default_factory=dict)
