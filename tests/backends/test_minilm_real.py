"""all-MiniLM-L6-v2, real weights: localchat's sentence vectors against sentence-transformers'
pooling (mean over real tokens, L2-normalised) computed with transformers on the same folder, and a
small retrieval sanity case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.embeddings.model import load_embedding_model
from tests.helpers.minilm import minilm_folder  # noqa: F401  (fixture)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

SENTENCES = [
    "A man is eating food.",
    "A man is riding a horse.",
    "The new movie is awesome, I loved every minute of it and would watch it again tomorrow.",
    "Paris is the capital of France.",
    "naïve café — Ünïcödé text, with punctuation!?",
]


def _reference(folder: Path, sentences: list[str]) -> np.ndarray:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    enc = tok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_minilm_matches_sentence_transformers_pooling(minilm_folder: Path) -> None:  # noqa: F811
    model = load_embedding_model(minilm_folder)
    assert model.sentence.pooling == "mean" and model.sentence.normalize and model.encoder.dimension == 384
    items = [model.encode_text(s) for s in SENTENCES]
    ref_tok = transformers.AutoTokenizer.from_pretrained(minilm_folder)
    assert [i.ids for i in items] == [ref_tok(s)["input_ids"] for s in SENTENCES]  # WordPiece parity
    ours = model.encoder.embed(items)
    expected = _reference(minilm_folder, SENTENCES)
    cosine = (ours * expected).sum(1)
    assert cosine.min() >= 0.9999, cosine
    # retrieval: the query finds its passage
    query = model.encoder.embed([model.encode_text("What is the capital city of France?")])[0]
    assert int(np.argmax(ours @ query)) == 3
