"""What loading a model yields: config, lazily read weights, tokenizer, chat template, defaults."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from localchat.errors import ModelLoadError
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

    def release_weights(self) -> None:
        """Forget the weight source once a runner holds its own copy: the file mapping (a GGUF reader
        also keeps its tensor tables) then leaves memory, unless a runner kept zero-copy views of it.
        Another runner would need the model loaded again."""
        self.iter_weights = _released_weights
        gc.collect()  # the reader's objects reference each other


def _released_weights() -> Iterator[WeightTensor]:
    raise ModelLoadError(
        "This model's weights were already handed to a runner and released; load the model again."
    )
