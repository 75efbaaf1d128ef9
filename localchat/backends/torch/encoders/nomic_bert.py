"""nomic-bert encoders (nomic-embed-text v1/v1.5): BERT's post-LayerNorm blocks and token types, but
rotary positions instead of a position table, a SwiGLU MLP and no biases in the linear layers.

Reads both spellings of the checkpoint: nomic's own (`config.json` with n_embd/n_head/rotary_emb_base,
tensors `emb_ln`, `encoder.layers.N.attn.Wqkv`, `mlp.fc11/fc12/fc2`, `norm1/2`, as the published
remote code writes them) and transformers' native `nomic_bert` (`layers.N.self_attn.q_proj`, ...).
Tensors are renamed to the native names at load, the fused Wqkv split into q, k and v."""

from __future__ import annotations

import re
from collections.abc import Callable
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

# nomic's remote-code names -> transformers' native ones (fc11 is the "up" half, fc12 the gate).
_RENAMES = (
    (r"^encoder\.layers\.", "layers."),
    (r"^emb_ln\.", "embeddings.LayerNorm."),
    (r"\.attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.mlp\.fc11\.", ".mlp.up_proj."),
    (r"\.mlp\.fc12\.", ".mlp.gate_proj."),
    (r"\.mlp\.fc2\.", ".mlp.down_proj."),
    (r"\.norm1\.", ".post_attention_layernorm."),
    (r"\.norm2\.", ".post_mlp_layernorm."),
)
_GATE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "swiglu": F.silu,
    "silu": F.silu,
    "geglu": F.gelu,
    "gelu": F.gelu,
}


def native_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        for pattern, repl in _RENAMES:
            name = re.sub(pattern, repl, name)
        if name.endswith(".attn.Wqkv.weight"):
            prefix = name[: -len("attn.Wqkv.weight")]
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                out[f"{prefix}self_attn.{part}_proj.weight"] = chunk.contiguous()
            continue
        out[name] = tensor
    return out


def _first(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


class NomicBertEncoder:
    is_reranker = False

    def __init__(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        sentence: SentenceConfig,
        dense: DenseStack,
    ) -> None:
        self.w = native_names(tensors)
        self.sentence = sentence
        self.dense = dense
        hidden = int(_first(config, "hidden_size", "n_embd"))
        self.heads = int(_first(config, "num_attention_heads", "n_head"))
        self.layers = int(_first(config, "num_hidden_layers", "n_layer"))
        self.eps = float(_first(config, "layer_norm_eps", "layer_norm_epsilon", default=1e-12))
        act = str(_first(config, "hidden_act", "activation_function", default="swiglu"))
        if act not in _GATE_ACTIVATIONS:
            raise ModelLoadError(f"Unsupported nomic-bert activation {act!r}.")
        self.act = _GATE_ACTIVATIONS[act]
        # NOTE: nomic-embed-text ships post-norm, full, non-interleaved rotary; other variants are refused.
        if config.get("prenorm") or float(config.get("rotary_emb_fraction", 1.0)) != 1.0:
            raise ModelLoadError("nomic-bert with prenorm or partial rotary is not supported.")
        if config.get("rotary_emb_interleaved"):
            raise ModelLoadError("nomic-bert with interleaved rotary is not supported.")
        rope = config.get("rope_parameters") or {}
        theta = float(
            rope.get("rope_theta") or _first(config, "rotary_emb_base", "rope_theta", default=1000.0)
        )
        self.head_dim = int(config.get("head_dim") or hidden // self.heads)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.max_positions = int(_first(config, "max_position_embeddings", "n_positions", default=2048))
        self.dimension = dense.layers[-1][0].shape[0] if dense.layers else hidden
        needed = ("embeddings.word_embeddings.weight", "layers.0.self_attn.q_proj.weight")
        missing = [n for n in needed if n not in self.w]
        if missing:
            raise ModelLoadError(f"The nomic-bert checkpoint lacks {', '.join(missing)}.")

    @classmethod
    def from_folder(cls, folder: Path, config: dict[str, Any], sentence: SentenceConfig) -> NomicBertEncoder:
        return cls(config, read_tensors(folder), sentence, DenseStack(sentence.dense))

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w.get(name + ".bias"), self.eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def batch_tensors(self, batch: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pad_batch(batch, self.pad_id)

    def hidden_states(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        w = self.w
        n, length = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids]
        if "embeddings.token_type_embeddings.weight" in w:
            x = x + w["embeddings.token_type_embeddings.weight"][types]
        x = self._ln(x, "embeddings.LayerNorm")
        angles = torch.outer(torch.arange(length).float(), self.inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        half = self.head_dim // 2

        def rotate(t: torch.Tensor) -> torch.Tensor:
            return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

        attend = mask[:, None, None, :]
        for i in range(self.layers):
            p = f"layers.{i}."
            q, k, v = (
                self._linear(x, p + f"self_attn.{part}_proj")
                .view(n, length, self.heads, self.head_dim)
                .transpose(1, 2)
                for part in "qkv"
            )
            a = F.scaled_dot_product_attention(rotate(q), rotate(k), v, attn_mask=attend)
            a = self._linear(a.transpose(1, 2).reshape(n, length, -1), p + "self_attn.o_proj")
            x = self._ln(x + a, p + "post_attention_layernorm")
            gate = self.act(self._linear(x, p + "mlp.gate_proj"))
            h = self._linear(gate * self._linear(x, p + "mlp.up_proj"), p + "mlp.down_proj")
            x = self._ln(x + h, p + "post_mlp_layernorm")
        return x

    @torch.inference_mode()
    def embed(self, batch: list[Encoded]) -> np.ndarray:
        ids, types, mask = self.batch_tensors(batch)
        hidden = self.hidden_states(ids, types, mask)
        return sentence_vectors(hidden, mask, self.sentence, self.dense).float().numpy()

    def score(self, batch: list[Encoded]) -> np.ndarray:
        raise ModelLoadError("nomic-bert rerankers are not supported.")
