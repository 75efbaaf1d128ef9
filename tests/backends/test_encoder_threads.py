"""`--threads` reaches the embedding model: its passes run with that many intra-op threads on the worker
thread that runs them, without changing the count of the thread that set its own (the chat runner's)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from localchat.embeddings.model import load_embedding_model
from tests.helpers.minilm import ensure_minilm

torch = pytest.importorskip("torch")
TEXTS = ["A man is eating food.", "Paris is the capital of France."]


def _in_a_new_thread(run: Callable[[], np.ndarray]) -> tuple[np.ndarray, int]:
    """A pass on a fresh worker thread (as the batching engine runs it), and that thread's count after."""
    out: list[tuple[np.ndarray, int]] = []
    worker = threading.Thread(target=lambda: out.append((run(), torch.get_num_threads())))
    worker.start()
    worker.join()
    return out[0]


def test_threads_apply_to_the_encoders_pass_only() -> None:
    folder = ensure_minilm()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the chat runner's choice on its own thread
        plain = load_embedding_model(folder)
        one = load_embedding_model(folder, threads=1)
        items = [one.encode_text(t) for t in TEXTS]
        expected, default_count = _in_a_new_thread(lambda: plain.encoder.embed(items))
        got, count = _in_a_new_thread(lambda: one.encoder.embed(items))
        assert default_count == 2 and count == 1  # without --threads a worker takes the default
        assert torch.get_num_threads() == 2  # the other thread's count is untouched
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert one.encoder.dimension == 384 and not one.encoder.is_reranker  # the rest passes through
    finally:
        torch.set_num_threads(before)
