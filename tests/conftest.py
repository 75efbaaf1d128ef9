"""Shared fixtures. The real model is fetched once into the repo's .models/ (git-ignored)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1, through the same fetcher the app uses for its default model."""
    from localchat.default_model import ensure_default_model

    override = os.environ.get("LOCALCHAT_TEST_GGUF")
    if override:
        return Path(override)
    return ensure_default_model(REPO / ".models")
