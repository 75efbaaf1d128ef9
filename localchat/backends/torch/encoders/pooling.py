"""Sentence vectors from hidden states, as sentence-transformers computes them: CLS, mean over the
real tokens, or the last real token; then the Dense layers and the L2 normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.backends.torch.encoders.weights import read_tensors
from localchat.embeddings.st_config import DenseLayer, SentenceConfig


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [n, L, d], mask [n, L] bool (right padding) -> [n, d]."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "mean":
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    last = mask.sum(1) - 1
    return hidden[torch.arange(hidden.shape[0]), last]


class DenseStack:
    def __init__(self, layers: tuple[DenseLayer, ...]) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor | None, str]] = []
        for layer in layers:
            t = read_tensors(layer.path)
            self.layers.append((t["linear.weight"], t.get("linear.bias"), layer.activation))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for weight, bias, activation in self.layers:
            x = F.linear(x, weight, bias)
            if activation == "tanh":
                x = torch.tanh(x)
        return x


def sentence_vectors(
    hidden: torch.Tensor, mask: torch.Tensor, sentence: SentenceConfig, dense: DenseStack
) -> torch.Tensor:
    x = dense(pool(hidden, mask, sentence.pooling))
    if sentence.normalize:
        x = F.normalize(x, p=2.0, dim=-1)
    return x
