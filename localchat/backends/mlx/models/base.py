"""The decoder-only causal LM skeleton: embed -> N layers -> final norm -> LM head.

A model file subclasses `DecoderLM`, names its `layer_class`, and overrides a step where its
architecture differs. Arrays start empty (None) and are filled by localchat/backends/mlx/weights.py,
which checks each against the shapes the layer declares.
"""

from __future__ import annotations

import mlx.core as mx

from localchat.backends.mlx.attention import AttentionMetadata, LayerCache
from localchat.backends.mlx.layers import Rotary
from localchat.backends.mlx.quant import Embedding, Weight, linear, take_rows
from localchat.weights.config import ModelConfig


class Layer:
    """A decoder layer: `shapes` names every array it needs (fused parts as `name.part`)."""

    shapes: dict[str, tuple[int, ...]]

    def __init__(self, config: ModelConfig, index: int) -> None:
        self.shapes = {}

    def __call__(
        self, x: mx.array, rotary: Rotary, positions: mx.array, meta: AttentionMetadata, cache: LayerCache
    ) -> mx.array:
        raise NotImplementedError

    def declare(self, name: str, *shape: int) -> None:
        """Register an array the checkpoint must provide (the attribute, None until the loader fills
        it, is set by the layer itself so that it is typed)."""
        self.shapes[name] = shape

    def wants(self, attr: str) -> bool:
        return any(key.split(".")[0] == attr for key in self.shapes)

    def missing(self) -> list[str]:
        return sorted({k.split(".")[0] for k in self.shapes if getattr(self, k.split(".")[0]) is None})

    def finish(self) -> None:
        """Called once every weight arrived (e.g. to restack them)."""


class DecoderLM:
    layer_class: type[Layer]

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.embed: Embedding | None = None  # [vocab, hidden]
        self.layers = [self.layer_class(config, i) for i in range(config.num_hidden_layers)]
        self.norm: mx.array | None = None  # [hidden]
        self.lm_head: Weight | None = None  # [vocab, hidden]; None: the embedding serves
        self.rotary = Rotary(config)

    def after_load(self) -> None:
        """Called once every weight is in place (a family may fold constants into them)."""

    def embed_tokens(self, input_ids: mx.array) -> mx.array:
        assert self.embed is not None
        return take_rows(self.embed, input_ids)  # [T, hidden]

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        """input_ids/positions int32 [T] -> pre-norm hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, self.rotary, positions, meta, cache)
        return x

    def logits(self, hidden: mx.array) -> mx.array:
        """hidden [N, hidden] (pre-norm) -> logits [N, vocab] in the compute dtype."""
        head = self.lm_head if self.lm_head is not None else self.embed
        assert head is not None
        return linear(mx.fast.rms_norm(hidden, self.norm, self.config.rms_norm_eps), head)
