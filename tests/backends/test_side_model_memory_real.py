"""The real all-MiniLM-L6-v2 as the embedding model beside a chat model (fake chat backend, real HTTP
app): GET /api/models reports its resident bytes (checked against the loaded tensors), and a chat model
that fits only without it is refused with a 507 that names it instead of it being unloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from localchat import hub as local_hub
from localchat.embeddings.model import EmbeddingModel, load_embedding_model
from localchat.models.manager import ModelManager
from localchat.models.memory import MIB, compute_dtype, estimate
from localchat.server.app import create_app
from tests.helpers.fake_app import fake_settings
from tests.helpers.minilm import ensure_minilm
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

torch = pytest.importorskip("torch")
TINY = "org/tiny-GGUF"


@pytest.fixture(scope="module")
def minilm() -> EmbeddingModel:
    return load_embedding_model(ensure_minilm())


def _tensor_bytes(value: Any, seen: set[int]) -> int:
    """Bytes of every distinct tensor the encoder holds (its weight dict, layers, head)."""
    if isinstance(value, torch.Tensor):
        if id(value) in seen:
            return 0
        seen.add(id(value))
        return int(value.numel() * value.element_size())
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v, seen) for v in value)
    return 0


def test_the_manager_counts_the_embedding_model(
    fake_hub: Any, tmp_path: Path, minilm: EmbeddingModel
) -> None:
    cfg = tiny_config()
    tiny = write_tiny_gguf(tmp_path / "tiny-Q4_0.gguf", random_state_dict(cfg), cfg, qtype="Q4_0")
    fake_hub.add_repo(TINY, {"tiny-Q4_0.gguf": tiny.read_bytes()})
    model = local_hub.pull(f"{TINY}:Q4_0")
    settings = fake_settings()
    dtype = compute_dtype(settings.dtype, settings.device, settings.backend)
    need = estimate(model.path, settings.kv_cache_mib, settings.isq, dtype, settings.max_num_seqs).total
    measured = _tensor_bytes(vars(minilm.encoder), set())  # 90,854,912: float32, 22.7M values
    assert measured > 80 * MIB

    # Free RAM for the chat model plus half the embedding model: it fits alone, not beside MiniLM.
    room = need + measured // 2
    alone = ModelManager(settings, available_memory=lambda: room)
    with TestClient(create_app(settings, alone), timeout=30) as client:
        assert client.get("/api/models").json()["side_models"] == []
        assert client.post("/api/models/load", json={"name": model.name}).status_code == 200

    manager = ModelManager(settings, available_memory=lambda: room)
    with TestClient(create_app(settings, manager, [minilm]), timeout=30) as client:
        (side,) = client.get("/api/models").json()["side_models"]
        assert side["id"] == "all-MiniLM-L6-v2" and side["type"] == "embedding"
        assert abs(side["resident_bytes"] - measured) <= 0.01 * measured, (side, measured)
        refused = client.post("/api/models/load", json={"name": model.name})
        assert refused.status_code == 507, refused.text
        message = refused.json()["error"]["message"]
        assert "'all-MiniLM-L6-v2'" in message and "never unloaded" in message
        assert "--embedding-model" in message
        assert client.get("/health").json()["loaded"] == ["fake-model"]  # nothing was unloaded for it
