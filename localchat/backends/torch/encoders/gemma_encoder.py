"""The bidirectional Gemma 3 text encoder of EmbeddingGemma (`gemma3_text` with
use_bidirectional_attention): Gemma 3's blocks (scaled embeddings, (1 + w) RMSNorms around attention
and MLP, per-head q/k norms, GeGLU, query_pre_attn_scalar), but every token sees every other one in
global layers and those within the window on either side in local layers. Its sentence vector comes
from mean pooling and the two Dense layers of its sentence-transformers folder."""

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


def _theta(config: dict[str, Any], kind: str) -> float:
    params = (config.get("rope_parameters") or {}).get(kind)
    if isinstance(params, dict):
        if params.get("rope_type", "default") != "default":
            raise ModelLoadError("Gemma encoders with rope scaling are not supported yet.")
        return float(params["rope_theta"])
    if kind == "sliding_attention":
        return float(config.get("rope_local_base_freq", 10_000.0))
    return float(config.get("rope_theta", 1_000_000.0))


class GemmaEncoder:
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
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        hidden = int(config["hidden_size"])
        self.hidden = hidden
        self.head_dim = int(config.get("head_dim") or 256)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.scaling = float(config.get("query_pre_attn_scalar") or self.head_dim) ** -0.5
        n = int(config["num_hidden_layers"])
        every = int(config.get("sliding_window_pattern", 6))
        self.kinds = [str(k) for k in config.get("layer_types") or []] or [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)
        ]
        self.window = int(config.get("sliding_window") or 512)
        self.inv_freq = {
            kind: 1.0 / (_theta(config, kind) ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
            for kind in set(self.kinds)
        }
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.max_positions = int(config.get("max_position_embeddings", 2048))
        self.dimension = dense.layers[-1][0].shape[0] if dense.layers else hidden
        if "embed_tokens.weight" not in tensors:
            raise ModelLoadError("The Gemma checkpoint lacks embed_tokens.weight.")

    @classmethod
    def from_folder(cls, folder: Path, config: dict[str, Any], sentence: SentenceConfig) -> GemmaEncoder:
        return cls(config, read_tensors(folder), sentence, DenseStack(sentence.dense))

    def _rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.rms_norm(x.float(), x.shape[-1:], None, self.eps) * (1.0 + self.w[name].float())

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def hidden_states(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, length = ids.shape
        x = self.w["embed_tokens.weight"][ids] * torch.tensor(self.hidden**0.5, dtype=torch.float32)
        positions = torch.arange(length).float()
        distance = (positions[:, None] - positions[None, :]).abs()
        masks = {
            "full_attention": mask[:, None, None, :],
            "sliding_attention": mask[:, None, None, :] & (distance < self.window)[None, None],
        }
        rope = {}
        for kind, inv in self.inv_freq.items():
            emb = torch.cat((torch.outer(positions, inv),) * 2, dim=-1)
            rope[kind] = (emb.cos(), emb.sin())
        group = self.heads // self.kv_heads
        for i, kind in enumerate(self.kinds):
            p = f"layers.{i}."
            h = self._rms(x, p + "input_layernorm.weight")
            q = self._linear(h, p + "self_attn.q_proj").view(n, length, self.heads, self.head_dim)
            k = self._linear(h, p + "self_attn.k_proj").view(n, length, self.kv_heads, self.head_dim)
            v = self._linear(h, p + "self_attn.v_proj").view(n, length, self.kv_heads, self.head_dim)
            q = self._rms(q, p + "self_attn.q_norm.weight").transpose(1, 2)
            k = self._rms(k, p + "self_attn.k_norm.weight").transpose(1, 2)
            v = v.transpose(1, 2)
            cos, sin = rope[kind]
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            if group > 1:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[kind], scale=self.scaling)
            a = self._linear(a.transpose(1, 2).reshape(n, length, -1), p + "self_attn.o_proj")
            x = x + self._rms(a, p + "post_attention_layernorm.weight")
            h = self._rms(x, p + "pre_feedforward_layernorm.weight")
            gated = F.gelu(self._linear(h, p + "mlp.gate_proj"), approximate="tanh") * self._linear(
                h, p + "mlp.up_proj"
            )
            x = x + self._rms(
                self._linear(gated, p + "mlp.down_proj"), p + "post_feedforward_layernorm.weight"
            )
        return self._rms(x, "norm.weight")

    def batch_tensors(self, batch: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pad_batch(batch, self.pad_id)

    @torch.inference_mode()
    def embed(self, batch: list[Encoded]) -> np.ndarray:
        ids, types, mask = self.batch_tensors(batch)
        hidden = self.hidden_states(ids, types, mask)
        return sentence_vectors(hidden, mask, self.sentence, self.dense).float().numpy()

    def score(self, batch: list[Encoded]) -> np.ndarray:
        raise ModelLoadError("Gemma rerankers are not supported.")
