"""ModernBERT encoders (gte-modernbert, modernbert-embed, nomic's ModernBERT models): pre-LayerNorm
blocks without biases, rotary positions with one theta for global and one for local layers, local
layers attending only within +-window/2 tokens, and a GeGLU MLP (Wi gives input and gate halves).
Reads both the original config.json (global_attn_every_n_layers, *_rope_theta, local_attention) and
transformers v5's (layer_types, rope_parameters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from localchat.backends.torch.encoders.bert import pad_batch
from localchat.backends.torch.encoders.pooling import DenseStack, sentence_vectors
from localchat.backends.torch.encoders.weights import read_tensors
from localchat.embeddings.st_config import SentenceConfig
from localchat.embeddings.text import Encoded
from localchat.errors import ModelLoadError

_ACTIVATIONS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}


def _layer_kinds(config: dict[str, Any]) -> list[str]:
    n = int(config["num_hidden_layers"])
    if config.get("layer_types"):
        return [str(t) for t in config["layer_types"]]
    every = int(config.get("global_attn_every_n_layers", 3))
    return ["full_attention" if i % every == 0 else "sliding_attention" for i in range(n)]


def _theta(config: dict[str, Any], kind: str) -> float:
    params = (config.get("rope_parameters") or {}).get(kind)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    if kind == "sliding_attention":
        return float(config.get("local_rope_theta", 10_000.0))
    return float(config.get("global_rope_theta", 160_000.0))


class ModernBertEncoder:
    is_reranker = False

    def __init__(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        sentence: SentenceConfig,
        dense: DenseStack,
    ) -> None:
        self.w = tensors
        self.sentence = sentence
        self.dense = dense
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("norm_eps", 1e-5))
        act = str(config.get("hidden_activation", "gelu"))
        if act not in _ACTIVATIONS:
            raise ModelLoadError(f"Unsupported ModernBERT activation {act!r}.")
        self.act = _ACTIVATIONS[act]
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.kinds = _layer_kinds(config)
        self.half_window = int(config.get("sliding_window") or int(config.get("local_attention", 128)) // 2)
        self.max_positions = int(config.get("max_position_embeddings", 8192))
        hidden = int(config["hidden_size"])
        self.head_dim = hidden // self.heads
        self.inv_freq = {
            kind: 1.0 / (_theta(config, kind) ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
            for kind in set(self.kinds)
        }
        self.dimension = dense.layers[-1][0].shape[0] if dense.layers else hidden
        if "embeddings.tok_embeddings.weight" not in tensors:
            raise ModelLoadError("The ModernBERT checkpoint lacks embeddings.tok_embeddings.weight.")

    @classmethod
    def from_folder(cls, folder: Path, config: dict[str, Any], sentence: SentenceConfig) -> ModernBertEncoder:
        return cls(config, read_tensors(folder), sentence, DenseStack(sentence.dense))

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w.get(name + ".bias"), self.eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def hidden_states(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, length = ids.shape
        x = self._ln(self.w["embeddings.tok_embeddings.weight"][ids], "embeddings.norm")
        positions = torch.arange(length).float()
        distance = (positions[:, None] - positions[None, :]).abs()
        masks = {
            "full_attention": mask[:, None, None, :],
            "sliding_attention": mask[:, None, None, :] & (distance <= self.half_window)[None, None],
        }
        rope = {}
        for kind, inv in self.inv_freq.items():
            angles = torch.outer(positions, inv)
            emb = torch.cat((angles, angles), dim=-1)
            rope[kind] = (emb.cos(), emb.sin())
        for i, kind in enumerate(self.kinds):
            p = f"layers.{i}."
            h = self._ln(x, p + "attn_norm") if p + "attn_norm.weight" in self.w else x
            qkv = self._linear(h, p + "attn.Wqkv").view(n, length, 3, self.heads, self.head_dim)
            q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
            cos, sin = rope[kind]
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[kind])
            x = x + self._linear(a.transpose(1, 2).reshape(n, length, -1), p + "attn.Wo")
            up, gate = self._linear(self._ln(x, p + "mlp_norm"), p + "mlp.Wi").chunk(2, dim=-1)
            x = x + self._linear(self.act(up) * gate, p + "mlp.Wo")
        return self._ln(x, "final_norm")

    def batch_tensors(self, batch: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pad_batch(batch, self.pad_id)

    @torch.inference_mode()
    def embed(self, batch: list[Encoded]) -> np.ndarray:
        ids, types, mask = self.batch_tensors(batch)
        hidden = self.hidden_states(ids, types, mask)
        return sentence_vectors(hidden, mask, self.sentence, self.dense).float().numpy()

    def score(self, batch: list[Encoded]) -> np.ndarray:
        raise ModelLoadError("ModernBERT rerankers are not supported yet.")
