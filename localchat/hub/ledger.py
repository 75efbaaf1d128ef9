"""What localchat itself downloaded (`<data dir>/downloads.json`): rm never deletes anything else
unless forced, and `list` shows pulls that have not finished yet."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localchat.hub.cache import write_atomically

LEDGER = "downloads.json"
_lock = threading.Lock()


@dataclass(slots=True)
class LedgerFile:
    path: str  # repo-relative
    etag: str
    size: int
    sha256: str | None


@dataclass(slots=True)
class LedgerModel:
    name: str  # canonical: alias, ORG/REPO:QUANT or ORG/REPO
    repo_id: str
    revision: str | None
    commit: str
    quant: str | None
    format: str
    cache: str  # the HF cache the files went to
    files: list[LedgerFile] = field(default_factory=list)
    complete: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LedgerModel:
        files = [LedgerFile(**f) for f in d.get("files", [])]
        return cls(**{**d, "files": files})


def load(data_dir: Path) -> dict[str, LedgerModel]:
    path = data_dir / LEDGER
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return {name: LedgerModel.from_dict(d) for name, d in raw.get("models", {}).items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, KeyError):  # unreadable: treat as empty rather than block pulls
        return {}


def update(data_dir: Path, change: Callable[[dict[str, LedgerModel]], None]) -> None:
    """Read, change and atomically rewrite the ledger (one writer at a time in this process)."""
    from filelock import FileLock

    data_dir.mkdir(parents=True, exist_ok=True)
    with _lock, FileLock(str(data_dir / f".{LEDGER}.lock")):
        models = load(data_dir)
        change(models)
        body = {"models": {name: asdict(m) for name, m in sorted(models.items())}}
        write_atomically(data_dir / LEDGER, json.dumps(body, indent=1).encode())


def owned_etags(models: dict[str, LedgerModel], repo_id: str) -> set[str]:
    return {f.etag for m in models.values() if m.repo_id == repo_id for f in m.files}
