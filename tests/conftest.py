"""Shared fixtures. The real model is fetched once into the repo's .models/ (git-ignored)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The Triton test modules set this before triton decorates the kernels, but a module collected earlier
# can import the kernels first (then they compile for a GPU and fail on CPU tensors): set it before any.
if os.environ.get("LOCALCHAT_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1, through the same fetcher the app uses for its default model."""
    override = os.environ.get("LOCALCHAT_TEST_GGUF")
    if override:  # before importing the app's fetcher: the GPU machine runs tests without its deps
        return Path(override)
    from localchat.models.default_model import ensure_default_model

    return ensure_default_model(REPO / ".models")


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A running fake Hugging Face hub; HF_ENDPOINT points at it, and the HF cache and localchat's
    data dir are fresh folders under tmp_path (`hub_home.cache`, `hub_home.data`)."""
    from tests.helpers.fake_hub import FakeHub

    hub = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "2")
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))  # never pick up a real login
    yield hub
    hub.stop()
