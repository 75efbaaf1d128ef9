"""Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention (q/k norm) with a sparse mixture of SwiGLU experts;
layers in `mlp_only_layers` or off the `decoder_sparse_step` keep a dense MLP."""

from __future__ import annotations

from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.moe import MoeLayer
from localchat.backends.mlx.models.qwen3 import Qwen3Layer


class Qwen3MoeLayer(MoeLayer, Qwen3Layer):  # MoeLayer's MLP, Qwen3Layer's q/k norm
    pass


class Model(DecoderLM):
    layer_class = Qwen3MoeLayer
