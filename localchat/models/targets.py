"""Which model a name means on this machine, without loading it: the model flags (`--f`, `--w`, `--m`),
the local store of `localchat.hub` (catalog aliases, `ORG/REPO[:QUANT]`, the HF cache), and which
model the server starts with when no flag names one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat import hub
from localchat.errors import LocalchatError
from localchat.models.catalog import DEFAULT_ALIAS, ResolvedModel

if TYPE_CHECKING:
    from localchat.config import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StartupChoice:
    name: str | None  # what to load; None: nothing on disk and nothing to fetch (the UI offers one)
    target: ResolvedModel | None  # already on disk; None with a name: pull it first
    by_flags: bool = False  # --f/--w/--m or the fake backend: built the way the flags say


def from_local(local: Any) -> ResolvedModel:
    """A `hub.LocalModel` as something the loader takes; its file name is accepted as `model` too."""
    path = Path(local.path)
    return ResolvedModel(path, str(local.name), [path.name] if path.is_file() else [])


def find_local(name: str, data_dir: Path | None) -> ResolvedModel | None:
    """A complete local model by name (alias, repo id, `ORG/REPO:QUANT`), or None. Never downloads."""
    local = hub.find_local(name, data_dir=data_dir)
    if local is None or not getattr(local, "complete", True):
        return None
    return from_local(local)


def list_local(data_dir: Path | None) -> list[Any]:
    """The hub's local models (complete and partial); [] if the store cannot be read."""
    try:
        return list(hub.list_local(data_dir=data_dir))
    except (LocalchatError, OSError) as exc:  # a broken cache or data dir must not take the API down
        log.warning("listing local models failed: %s", getattr(exc, "message", None) or exc)
        return []


def startup_choice(settings: Settings, data_dir: Path | None) -> StartupChoice:
    """What the server loads at start: the flags' model (pulled if missing), else the default model if
    it is here, else any local model, else nothing (UI) or the default, pulled (API only)."""
    if settings.backend == "fake" or settings.file or settings.weights:
        return StartupChoice(_flag_label(settings), None, by_flags=True)
    if settings.model:
        if Path(settings.model).expanduser().exists():
            return StartupChoice(settings.model, None, by_flags=True)
        return StartupChoice(settings.model, find_local(settings.model, data_dir))
    if (default := find_local(DEFAULT_ALIAS, data_dir)) is not None:
        return StartupChoice(DEFAULT_ALIAS, default)
    complete = [m for m in list_local(data_dir) if getattr(m, "complete", True)]
    if complete:
        return StartupChoice(str(complete[0].name), from_local(complete[0]))
    # Nobody can click "Download" without the UI: fetch the default like earlier versions did.
    return StartupChoice(None if settings.ui else DEFAULT_ALIAS, None)


def _flag_label(settings: Settings) -> str:
    if settings.backend == "fake":
        return "fake-model"
    if settings.file:
        return Path(settings.file).expanduser().stem
    return Path(settings.weights or "model").expanduser().name
