"""BERT, RoBERTa and XLM-RoBERTa encoders (post-LayerNorm blocks, learned absolute positions, token
types), written against the checkpoint's own tensor names. Inputs are right-padded per batch and the
padding is masked out of attention, so an input's vector does not depend on its batch mates. Also the
two sequence-classification heads used by cross-encoder rerankers (BERT: pooler + classifier;
RoBERTa: classifier.dense + classifier.out_proj on the first token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from localchat.backends.torch.encoders.pooling import DenseStack, sentence_vectors
from localchat.backends.torch.encoders.weights import read_tensors
from localchat.embeddings.st_config import SentenceConfig
from localchat.embeddings.text import Encoded
from localchat.errors import ModelLoadError

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
_SIGMOID = "torch.nn.modules.activation.Sigmoid"
_IDENTITY = "torch.nn.modules.linear.Identity"


def pad_batch(batch: list[Encoded], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, type ids, mask) right-padded to the longest input."""
    width = max(len(e) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.bool)
    for i, e in enumerate(batch):
        n = len(e)
        ids[i, :n] = torch.tensor(e.ids)
        types[i, :n] = torch.tensor(e.type_ids)
        mask[i, :n] = True
    return ids, types, mask


class BertEncoder:
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
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        act = str(config.get("hidden_act", "gelu"))
        if act not in _ACTIVATIONS:
            raise ModelLoadError(f"Unsupported encoder activation {act!r}.")
        self.act = _ACTIVATIONS[act]
        self.pad_id = int(config.get("pad_token_id") or 0)
        roberta = config.get("model_type") in ("roberta", "xlm-roberta", "camembert")
        # RoBERTa numbers positions from padding_idx + 1 (its table's first rows are never used).
        self.position_offset = self.pad_id + 1 if roberta else 0
        self.max_positions = int(config.get("max_position_embeddings", 512)) - self.position_offset
        archs = config.get("architectures") or []
        self.is_reranker = any(str(a).endswith("ForSequenceClassification") for a in archs)
        self.head = "roberta" if "classifier.out_proj.weight" in tensors else "bert"
        self.sigmoid = True
        if self.is_reranker:
            labels = config.get("num_labels") or len(config.get("id2label") or {0: ""})
            if int(labels) != 1:
                raise ModelLoadError(
                    f"Rerank models with {labels} labels are not supported (only one score)."
                )
            # sentence-transformers' CrossEncoder default for one label is a sigmoid; a saved
            # activation_fn (e.g. Identity for raw logits) overrides it.
            activation = (config.get("sentence_transformers") or {}).get("activation_fn", _SIGMOID)
            self.sigmoid = activation != _IDENTITY
        hidden = int(config["hidden_size"])
        self.dimension = dense.layers[-1][0].shape[0] if dense.layers else hidden
        missing = [
            n
            for n in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight")
            if n not in tensors
        ]
        if missing:
            raise ModelLoadError(f"The encoder checkpoint lacks {', '.join(missing)}.")

    @classmethod
    def from_folder(cls, folder: Path, config: dict[str, Any], sentence: SentenceConfig) -> BertEncoder:
        return cls(config, read_tensors(folder), sentence, DenseStack(sentence.dense))

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def batch_tensors(self, batch: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return pad_batch(batch, self.pad_id)

    def hidden_states(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        w = self.w
        n, length = ids.shape
        positions = torch.arange(length) + self.position_offset
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][positions]
        )
        if "embeddings.token_type_embeddings.weight" in w:
            x = x + w["embeddings.token_type_embeddings.weight"][types]
        x = self._ln(x, "embeddings.LayerNorm")
        attend = mask[:, None, None, :]  # padding keys are never attended to
        head_dim = x.shape[-1] // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def split(t: torch.Tensor) -> torch.Tensor:
                return t.view(n, length, self.heads, head_dim).transpose(1, 2)

            q = split(self._linear(x, p + "attention.self.query"))
            k = split(self._linear(x, p + "attention.self.key"))
            v = split(self._linear(x, p + "attention.self.value"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
            a = a.transpose(1, 2).reshape(n, length, -1)
            x = self._ln(x + self._linear(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self.act(self._linear(x, p + "intermediate.dense"))
            x = self._ln(x + self._linear(h, p + "output.dense"), p + "output.LayerNorm")
        return x

    @torch.inference_mode()
    def embed(self, batch: list[Encoded]) -> np.ndarray:
        ids, types, mask = self.batch_tensors(batch)
        hidden = self.hidden_states(ids, types, mask)
        return sentence_vectors(hidden, mask, self.sentence, self.dense).float().numpy()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        first = hidden[:, 0]
        if self.head == "roberta":
            return self._linear(torch.tanh(self._linear(first, "classifier.dense")), "classifier.out_proj")
        pooled = torch.tanh(self._linear(first, "pooler.dense"))
        return self._linear(pooled, "classifier")

    @torch.inference_mode()
    def score(self, batch: list[Encoded]) -> np.ndarray:
        ids, types, mask = self.batch_tensors(batch)
        logits = self.logits(self.hidden_states(ids, types, mask))
        return (torch.sigmoid(logits) if self.sigmoid else logits).float().numpy()
