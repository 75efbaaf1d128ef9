"""Decoder embedding and rerank models (Qwen3-Embedding, Qwen3-Reranker; gte-Qwen2 style qwen2 models): a Qwen2/Qwen3 decoder run
once over the whole input with causal attention, its final-normed hidden states pooled as the folder's
sentence-transformers config says (last token for Qwen3-Embedding). No KV cache: one pass per batch,
right padding masked out (a causal model's last real token never sees the padding after it).
As a reranker (Qwen3-Reranker), the (query, document) pair is written into its judging prompt and the
score is P("yes") against "no" for the next token."""

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

DECODERS = ("qwen2", "qwen3")


RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# Qwen3-Reranker's judging prompt, as its model card gives it.
_RERANK_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
_RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


class DecoderEncoder:
    def __init__(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        sentence: SentenceConfig,
        dense: DenseStack,
        yes_no: tuple[int, int] | None = None,
    ) -> None:
        self.w = tensors
        self.yes_no = yes_no  # token ids of "yes" and "no": a reranker
        self.is_reranker = yes_no is not None
        self.sentence = sentence
        self.dense = dense
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        hidden = int(config["hidden_size"])
        self.head_dim = int(config.get("head_dim") or hidden // self.heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        theta = (config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta", 10_000.0)
        self.inv_freq = 1.0 / (float(theta) ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        if (
            config.get("rope_scaling")
            or (config.get("rope_parameters") or {}).get("rope_type", "default") != "default"
        ):
            raise ModelLoadError("Decoder embedding models with rope scaling are not supported yet.")
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.max_positions = int(config.get("max_position_embeddings", 32_768))
        self.dimension = dense.layers[-1][0].shape[0] if dense.layers else hidden
        if "embed_tokens.weight" not in tensors:
            raise ModelLoadError("The decoder checkpoint lacks embed_tokens.weight.")

    @classmethod
    def from_folder(
        cls, folder: Path, config: dict[str, Any], sentence: SentenceConfig, rerank: bool = False
    ) -> DecoderEncoder:
        yes_no = None
        if rerank:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
            if yes is None or no is None:
                raise ModelLoadError(f"{folder}: no 'yes'/'no' tokens: not a Qwen3-Reranker style model.")
            yes_no = (yes, no)
        return cls(config, read_tensors(folder), sentence, DenseStack(sentence.dense), yes_no)

    @staticmethod
    def pair_text(query: str, document: str) -> str:
        """The reranker's input for one (query, document) pair."""
        body = f"<Instruct>: {RERANK_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
        return _RERANK_PREFIX + body + _RERANK_SUFFIX

    def _rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.rms_norm(x, x.shape[-1:], self.w[name], self.eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def hidden_states(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, length = ids.shape
        x = self.w["embed_tokens.weight"][ids]
        angles = torch.outer(torch.arange(length).float(), self.inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        # A padded query row would attend to nothing beyond itself; let it see itself to avoid NaNs.
        attend = (causal[None, None] & mask[:, None, None, :]) | torch.eye(length, dtype=torch.bool)
        group = self.heads // self.kv_heads
        for i in range(self.layers):
            p = f"layers.{i}."
            h = self._rms(x, p + "input_layernorm.weight")
            q = self._linear(h, p + "self_attn.q_proj").view(n, length, self.heads, self.head_dim)
            k = self._linear(h, p + "self_attn.k_proj").view(n, length, self.kv_heads, self.head_dim)
            v = self._linear(h, p + "self_attn.v_proj").view(n, length, self.kv_heads, self.head_dim)
            if p + "self_attn.q_norm.weight" in self.w:  # qwen3: per-head RMSNorm before rotary
                q = self._rms(q, p + "self_attn.q_norm.weight")
                k = self._rms(k, p + "self_attn.k_norm.weight")
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            if group > 1:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
            x = x + self._linear(a.transpose(1, 2).reshape(n, length, -1), p + "self_attn.o_proj")
            h = self._rms(x, p + "post_attention_layernorm.weight")
            gated = F.silu(self._linear(h, p + "mlp.gate_proj")) * self._linear(h, p + "mlp.up_proj")
            x = x + self._linear(gated, p + "mlp.down_proj")
        return self._rms(x, "norm.weight")

    def batch_tensors(self, batch: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pad_batch(batch, self.pad_id)

    @torch.inference_mode()
    def embed(self, batch: list[Encoded]) -> np.ndarray:
        ids, types, mask = self.batch_tensors(batch)
        hidden = self.hidden_states(ids, types, mask)
        return sentence_vectors(hidden, mask, self.sentence, self.dense).float().numpy()

    @torch.inference_mode()
    def score(self, batch: list[Encoded]) -> np.ndarray:
        if self.yes_no is None:
            raise ModelLoadError("This model was loaded as an embedding model, not a reranker.")
        ids, types, mask = self.batch_tensors(batch)
        hidden = self.hidden_states(ids, types, mask)
        last = hidden[torch.arange(hidden.shape[0]), mask.sum(1) - 1]
        head = self.w.get("lm_head.weight", self.w["embed_tokens.weight"])
        logits = last @ head[list(self.yes_no)].T  # [n, 2]: yes, no
        return torch.softmax(logits, dim=-1)[:, :1].float().numpy()
