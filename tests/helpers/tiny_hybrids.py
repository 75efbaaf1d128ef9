"""The tiny random hybrid models both prefix-caching suites (torch and MLX) run: one per kind of
recurrent layer (gated DeltaNet, Mamba-2, short conv)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.backends.test_granitemoehybrid import tiny_granite
from tests.backends.test_lfm2 import tiny_lfm2
from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.helpers.torch_models import bundle_from_hf

BUILDERS: dict[str, Callable[..., Any]] = {
    "qwen3_5": tiny_qwen3_5,
    "granite": tiny_granite,
    "lfm2": tiny_lfm2,
}


def runner_factory(
    make_runner: Callable[[Any], Any], build: Callable[..., Any], **overrides: object
) -> Callable[[], Any]:
    """A fresh runner per call over one converted bundle of `build(**overrides)`."""
    bundle = bundle_from_hf(build(**overrides))
    return lambda: make_runner(bundle)
