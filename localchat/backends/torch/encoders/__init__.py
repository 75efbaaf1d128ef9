"""Encoder models (bidirectional attention, one pass, no KV cache) for embeddings and reranking:
BERT, RoBERTa, XLM-RoBERTa, nomic-bert and ModernBERT (and Qwen2/Qwen3 decoders, last-token pooled) with their sentence-transformers pooling, and their sequence-
classification heads (cross-encoder rerankers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.errors import ModelLoadError, UnsupportedArchitectureError

if TYPE_CHECKING:
    from localchat.embeddings.model import Encoder
    from localchat.embeddings.st_config import SentenceConfig

BERT_LIKE = ("bert", "roberta", "xlm-roberta", "camembert")


def load_encoder(
    folder: Path, threads: int | None = None, rerank: bool = False
) -> tuple[Encoder, SentenceConfig]:
    """The encoder in `folder` (config.json + model.safetensors) and its pooling settings. `rerank`:
    a decoder is loaded as a yes/no reranker (Qwen3-Reranker); encoders say it by their head.
    `threads` (--threads): its passes run with that many intra-op threads; None: torch's count."""
    encoder, sentence = _load_encoder(folder, rerank)
    if threads:
        from localchat.backends.torch.encoders.threads import WithThreads

        encoder = WithThreads(encoder, threads)
    return encoder, sentence


def _load_encoder(folder: Path, rerank: bool) -> tuple[Encoder, SentenceConfig]:
    from localchat.embeddings.st_config import read_sentence_config

    if folder.is_file() and folder.suffix == ".gguf":  # llama.cpp's bert / nomic-bert layout
        from localchat.backends.torch.encoders.gguf_encoder import load_gguf_encoder

        return load_gguf_encoder(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read {folder / 'config.json'}: {exc}") from exc
    model_type = str(config.get("model_type", ""))
    sentence = read_sentence_config(folder, default_pooling="cls")
    if model_type == "modernbert":
        from localchat.backends.torch.encoders.modernbert import ModernBertEncoder

        return ModernBertEncoder.from_folder(folder, config, sentence), sentence
    if model_type == "nomic_bert":  # nomic-embed-text: rotary, SwiGLU, mean pooling
        from localchat.backends.torch.encoders.nomic_bert import NomicBertEncoder

        sentence = read_sentence_config(folder, default_pooling="mean")
        return NomicBertEncoder.from_folder(folder, config, sentence), sentence
    if model_type == "gemma3_text" and config.get("use_bidirectional_attention"):  # EmbeddingGemma
        from localchat.backends.torch.encoders.gemma_encoder import GemmaEncoder

        sentence = read_sentence_config(folder, default_pooling="mean")
        return GemmaEncoder.from_folder(folder, config, sentence), sentence
    if model_type in ("qwen2", "qwen3"):  # decoder embedding models: last-token pooling by default
        from localchat.backends.torch.encoders.decoder import DecoderEncoder

        sentence = read_sentence_config(folder, default_pooling="lasttoken")
        return DecoderEncoder.from_folder(folder, config, sentence, rerank=rerank), sentence
    if model_type not in BERT_LIKE:
        raise UnsupportedArchitectureError(
            model_type,
            [*BERT_LIKE, "nomic_bert", "modernbert", "qwen2", "qwen3", "gemma3_text (bidirectional)"],
        )
    from localchat.backends.torch.encoders.bert import BertEncoder

    return BertEncoder.from_folder(folder, config, sentence), sentence
