"""POST /v1/embeddings through the official openai SDK: shapes, unit norm, exact usage, base64, token-id
inputs, batch invariance, and the 400s."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

pytestmark = pytest.mark.slow

TEXTS = ["The cat sat on the mat.", "A kitten rested on the rug.", "Quarterly revenue grew by 4%."]


@pytest.fixture(scope="module")
def client(server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=300)


def test_batch_of_strings(client, backend, model_path) -> None:  # type: ignore[no-untyped-def]
    reply = client.embeddings.create(model="", input=TEXTS)
    assert reply.model and reply.object == "list" and [d.index for d in reply.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in reply.data])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    if backend == "fake":
        expected_tokens = sum(len(t.encode()) for t in TEXTS)  # one token per byte
    else:
        from localchat.weights.loader import load_model

        tokenizer = load_model(model_path).tokenizer
        expected_tokens = sum(len(tokenizer.encode(t)) for t in TEXTS)
        # A real model puts the two cat sentences closer than cat and revenue.
        assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == expected_tokens
    # Alone or batched, the same vector.
    alone = client.embeddings.create(model="", input=TEXTS[2]).data[0].embedding
    assert np.allclose(alone, vectors[2], atol=1e-4)


def test_base64_and_token_ids(client) -> None:  # type: ignore[no-untyped-def]
    floats = client.embeddings.create(model="", input=[[5, 6, 7, 8]], encoding_format="float")
    with httpx.Client(base_url=str(client.base_url), timeout=120) as http:
        raw = http.post("/embeddings", json={"input": [5, 6, 7, 8], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats.data[0].embedding, atol=1e-6)
    assert raw["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "dimensions": 8}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": []}, "input"),
        ({"input": [[-1, 2]]}, "input"),
        ({"input": [{"a": 1}]}, "input"),
    ],
)
def test_bad_requests_are_400(server, body, param) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=server.api_url, timeout=60) as http:
        reply = http.post("/embeddings", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
