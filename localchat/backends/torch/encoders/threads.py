"""`--threads` for the embedding and rerank models. torch's intra-op thread count is per OS thread once
that thread has run an op (OpenMP keeps it per thread; torch.set_num_threads sets the calling thread's
and the default of threads started later), so setting it at the start of each pass, on the worker
thread that runs the pass, leaves the chat runner's own per-step choice on its thread alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from localchat.embeddings.model import Encoder
    from localchat.embeddings.text import Encoded


class WithThreads:
    """An encoder whose passes run with `threads` intra-op threads; everything else is the encoder's."""

    def __init__(self, encoder: Encoder, threads: int) -> None:
        self._encoder = encoder
        self._threads = threads

    def __getattr__(self, name: str) -> Any:  # dimension, max_positions, is_reranker, pair_text, ...
        return getattr(self._encoder, name)

    def embed(self, batch: list[Encoded]) -> np.ndarray:
        torch.set_num_threads(self._threads)
        return self._encoder.embed(batch)

    def score(self, batch: list[Encoded]) -> np.ndarray:
        torch.set_num_threads(self._threads)
        return self._encoder.score(batch)
