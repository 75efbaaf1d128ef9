"""`localchat serve --embedding-model ... --rerank-model ...` as a subprocess (fake chat backend, real
all-MiniLM-L6-v2, a tiny random cross-encoder): /v1/embeddings through the official openai SDK served
by the embedding model, `dimensions`, and /v1/rerank (+ aliases) in the Jina/Cohere shape."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from localchat.embeddings.model import load_embedding_model
from tests.helpers.live_server import LiveServer, live_server
from tests.helpers.minilm import ensure_minilm

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

TEXTS = ["A man is eating food.", "Paris is the capital of France.", "The stock market fell sharply today."]
DOCS = [
    "Berlin is in Germany.",
    "Paris is the capital of France.",
    "Bananas are yellow.",
    "France borders Spain.",
]


def _tiny_reranker(folder: Path, minilm: Path) -> Path:
    """A random BertForSequenceClassification over MiniLM's vocabulary and tokenizer."""
    import torch

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128, num_labels=1,
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder)
    shutil.copy(minilm / "tokenizer.json", folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def minilm() -> Path:
    return ensure_minilm()


@pytest.fixture(scope="module")
def server(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    reranker = _tiny_reranker(tmp_path_factory.mktemp("reranker"), minilm)
    args = ["--backend", "fake", "--embedding-model", str(minilm), "--rerank-model", str(reranker)]
    with live_server(args) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


def test_embeddings_come_from_the_embedding_model(client: openai.OpenAI, minilm: Path) -> None:
    reply = client.embeddings.create(model=minilm.name, input=TEXTS)
    assert reply.model == minilm.name and [d.index for d in reply.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in reply.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    local = load_embedding_model(minilm)  # the same model in-process: the server's answer is its answer
    expected = local.encoder.embed([local.encode_text(t) for t in TEXTS])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    assert reply.usage.prompt_tokens == sum(len(local.encode_text(t)) for t in TEXTS)
    # `model` left out: the embedding model answers too (the SDK's base64 default)
    raw = client.embeddings.create(model="", input=TEXTS[1], encoding_format="base64")
    assert raw.model == minilm.name
    query = client.embeddings.create(model="", input="What is France's capital?").data[0].embedding
    assert int(np.argmax(vectors @ np.array(query))) == 1


def test_dimensions_truncate_and_renormalise(client: openai.OpenAI, minilm: Path) -> None:
    full = np.array(client.embeddings.create(model=minilm.name, input=TEXTS[0]).data[0].embedding)
    short = np.array(
        client.embeddings.create(model=minilm.name, input=TEXTS[0], dimensions=64).data[0].embedding
    )
    assert short.shape == (64,)
    np.testing.assert_allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-5)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=minilm.name, input=TEXTS[0], dimensions=385)
    assert info.value.body["param"] == "dimensions"  # type: ignore[index]


def test_models_lists_the_side_models(client: openai.OpenAI, minilm: Path) -> None:
    cards = {m.id: m.model_dump() for m in client.models.list().data}
    assert cards[minilm.name]["type"] == "embedding" and cards[minilm.name]["max_model_len"] == 256
    assert [c["type"] for c in cards.values() if c.get("type")] == ["embedding", "rerank"]
    assert client.models.retrieve(minilm.name).id == minilm.name


def test_chat_model_still_answers_when_named(client: openai.OpenAI) -> None:
    reply = client.embeddings.create(model="fake-model", input="abc")
    assert reply.model == "fake-model" and len(reply.data[0].embedding) != 384


def test_rerank_shape_order_and_aliases(server: LiveServer) -> None:
    with server.client() as http:
        body = {"query": "capital of France", "documents": DOCS, "top_n": 3}
        reply = http.post("/v1/rerank", json=body)
        assert reply.status_code == 200, reply.text
        data = reply.json()
        results = data["results"]
        assert len(results) == 3 and data["usage"]["total_tokens"] > 0
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)  # sigmoid
        assert all(r["document"]["text"] == DOCS[r["index"]] for r in results)
        full = http.post("/rerank", json={**body, "top_n": None, "return_documents": False}).json()["results"]
        assert sorted(r["index"] for r in full) == [0, 1, 2, 3] and "document" not in full[0]
        assert full[:3] == [{k: r[k] for k in ("index", "relevance_score")} for r in results]
        objects = {"query": "capital of France", "documents": [{"text": d} for d in DOCS]}
        assert (
            http.post("/v2/rerank", json=objects).json()["results"]
            == http.post("/v1/rerank", json={**body, "top_n": 4}).json()["results"]
        )
        bad = http.post("/v1/rerank", json={"query": "q", "documents": []})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents"
        wrong = http.post("/v1/embeddings", json={"model": data["model"], "input": "x"})
        assert wrong.status_code == 400 and "rerank model" in wrong.json()["error"]["message"]


def test_a_bad_embedding_model_stops_startup(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    folder = tmp_path / "not-a-model"
    folder.mkdir()
    env = {**os.environ, "LOCALCHAT_HOME": str(tmp_path / "home")}
    cmd = [
        sys.executable,
        "-m",
        "localchat",
        "serve",
        "--backend",
        "fake",
        "--p",
        "0",
        "--embedding-model",
        str(folder),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "not an encoder model folder (no config.json)" in done.stderr
