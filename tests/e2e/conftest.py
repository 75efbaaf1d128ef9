"""Live `localchat serve` subprocesses (one per backend, shared by the e2e modules): on the fake backend (always) and on the real SmolLM2 GGUF with
the torch backend (skipped, with the reason, until that backend can run here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.live_server import LiveServer, live_server, real_backend_missing, server_args

BACKENDS = [
    "fake",
    pytest.param("real", marks=pytest.mark.slow),
    pytest.param("real-mlx", marks=[pytest.mark.slow, pytest.mark.mlx]),
]
REAL = ("real", "real-mlx")
# MLX on a CPU is ~10x slower than torch: it runs the SDK/streaming conformance module only.
MLX_MODULES = {"test_openai_sdk"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        (drop if params.get("backend") == "real-mlx" and module not in MLX_MODULES else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _skip_unless_real(backend: str) -> None:
    if backend in REAL and (why := real_backend_missing()):
        pytest.skip(f"real-model server not available yet: {why}")
    if backend == "real-mlx":
        pytest.importorskip("mlx.core", reason="the mlx backend needs `pip install localchat-app[mlx]`")


@pytest.fixture(scope="package", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    _skip_unless_real(request.param)
    return request.param


@pytest.fixture(scope="package")
def model_path(backend: str, request: pytest.FixtureRequest) -> Path | None:
    return request.getfixturevalue("smollm2_gguf") if backend in REAL else None


@pytest.fixture(scope="package")
def server(backend: str, model_path: Path | None) -> Iterator[LiveServer]:
    with live_server(server_args(backend, model_path)) as srv:
        yield srv


@pytest.fixture(scope="package")
def prompt_tokens(backend: str, model_path: Path | None) -> Callable[[list[dict[str, Any]]], int]:
    """Counts a conversation's prompt tokens the way the server must (template + tokenizer, in-process)."""
    from localchat.weights.chat_template import ChatTemplate

    if backend == "fake":
        from localchat.backends.fake import fake_model_bundle

        bundle = fake_model_bundle()
    else:
        from localchat.weights.loader import load_model

        bundle = load_model(model_path)
    tok = bundle.tokenizer
    template = ChatTemplate(bundle.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token)
    return lambda messages: len(tok.encode(template.render(messages), add_special_tokens=False))
