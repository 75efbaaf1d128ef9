"""An embedding or rerank model loaded beside the chat model (`--embedding-model`): its folder, its
tokenizer, its sentence-transformers settings and its batching engine. The API routes ask it for
vectors (`embed`) or relevance scores (`rerank`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from localchat.backends import load_encoder  # imports torch only when an encoder is asked for
from localchat.embeddings.engine import BatchingEncoder
from localchat.embeddings.st_config import SentenceConfig
from localchat.embeddings.text import Encoded, EncoderTokenizer
from localchat.errors import InvalidRequestError, ModelLoadError

log = logging.getLogger("localchat")


class Encoder(Protocol):
    """What a backend's encoder offers (localchat/backends/torch/encoders/)."""

    dimension: int  # size of a sentence vector (after any Dense layers)
    max_positions: int  # the longest input the position table allows
    is_reranker: bool  # a sequence-classification head: `score` works, `embed` does not

    def embed(self, batch: list[Encoded]) -> np.ndarray: ...  # [n, dimension] float32

    def score(self, batch: list[Encoded]) -> np.ndarray: ...  # [n, 1] float32 relevance


@dataclass(slots=True)
class EmbeddingModel:
    model_id: str
    path: Path
    encoder: Encoder
    tokenizer: EncoderTokenizer
    sentence: SentenceConfig
    aliases: list[str] = field(default_factory=list)
    engine: BatchingEncoder | None = None

    def __post_init__(self) -> None:
        if self.engine is None:
            run = self.encoder.score if self.encoder.is_reranker else self.encoder.embed
            self.engine = BatchingEncoder(run)

    @property
    def kind(self) -> str:
        return "rerank" if self.encoder.is_reranker else "embedding"

    def knows_model(self, name: str | None) -> bool:
        return bool(name) and (name == self.model_id or name in self.aliases)

    async def embed(self, items: list[Encoded]) -> np.ndarray:
        if self.encoder.is_reranker:
            raise InvalidRequestError(
                f"{self.model_id} is a rerank model: use /v1/rerank, not /v1/embeddings.", param="model"
            )
        assert self.engine is not None
        return np.stack(await self.engine.submit(items))

    async def rerank(self, query: str, documents: list[str]) -> tuple[np.ndarray, int]:
        """One relevance score per document, and the tokens read."""
        if not self.encoder.is_reranker:
            raise InvalidRequestError(
                f"{self.model_id} is an embedding model, not a reranker (a cross-encoder).", param="model"
            )
        assert self.engine is not None
        pair_text = getattr(self.encoder, "pair_text", None)
        if pair_text is not None:  # a decoder reranker: one prompt per pair, no special tokens added
            items = [self.tokenizer.encode(pair_text(query, doc), special=False) for doc in documents]
        else:  # a cross-encoder: the tokenizer's pair encoding ([CLS] q [SEP] d [SEP], token types)
            items = [self.tokenizer.encode(query, doc) for doc in documents]
        scores = np.stack(await self.engine.submit(items))[:, 0]
        return scores, sum(len(i) for i in items)

    def encode_text(self, text: str, prompt_name: str | None = None) -> Encoded:
        return self.tokenizer.encode(self.sentence.prompt(prompt_name) + text)


def load_embedding_model(
    path: Path, model_id: str | None = None, threads: int | None = None, rerank: bool = False
) -> EmbeddingModel:
    """Read a sentence-transformers (or transformers) encoder folder, or a llama.cpp `bert` /
    `nomic-bert` GGUF file, onto the torch backend."""
    is_gguf = path.is_file() and path.suffix == ".gguf"
    if not is_gguf and not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is not an encoder model folder (no config.json) nor a .gguf file.")

    started = time.perf_counter()
    encoder, sentence = load_encoder(path, threads=threads, rerank=rerank)
    limit = min(sentence.max_seq_length or encoder.max_positions, encoder.max_positions)
    if is_gguf:
        from localchat.embeddings.gguf_text import gguf_encoder_tokenizer

        tokenizer = gguf_encoder_tokenizer(path, limit)
    else:
        tokenizer = EncoderTokenizer(path, limit)
    name = model_id or (path.stem if is_gguf else path.name)
    log.info(
        "embedding model %s (%s) loaded in %.1fs",
        name,
        "rerank" if encoder.is_reranker else "embedding",
        time.perf_counter() - started,
    )
    return EmbeddingModel(name, path, encoder, tokenizer, sentence, aliases=[str(path)])


def resolve_encoder_path(spec: str) -> tuple[Path, str]:
    """(folder, model id) for an --embedding-model / --rerank-model value: a local folder, else a
    models.yaml alias or a hub repo fetched into the data dir like any other model."""
    path = Path(spec).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path, path.stem if path.is_file() else path.name
    from localchat.models.resolve import resolve_model
    from localchat.paths import data_dir

    resolved = resolve_model(model=spec, data_dir=data_dir())
    if not (resolved.path.is_dir() or resolved.path.suffix == ".gguf"):
        raise ModelLoadError(f"{spec} is neither a safetensors model folder nor a GGUF file.")
    return resolved.path, resolved.model_id


def load_side_models(
    embedding: str | None, rerank: str | None, threads: int | None = None
) -> list[EmbeddingModel]:
    """The models the two flags name, checked to be of the kind the flag asks for; `threads`: --threads."""
    out = []
    for spec, kind in ((embedding, "embedding"), (rerank, "rerank")):
        if not spec:
            continue
        path, model_id = resolve_encoder_path(spec)
        model = load_embedding_model(path, model_id, threads=threads, rerank=kind == "rerank")
        if model.kind != kind:
            flag = "--embedding-model" if kind == "embedding" else "--rerank-model"
            raise ModelLoadError(
                f"{flag} {spec} is {'a rerank' if model.kind == 'rerank' else 'an embedding'} model, not {'a rerank' if kind == 'rerank' else 'an embedding'} model."
            )
        if spec != model_id:
            model.aliases.append(spec)
        out.append(model)
    return out
