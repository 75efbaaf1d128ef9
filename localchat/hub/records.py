"""The two records the model manager hands out: progress events and models on disk."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("resolving", "downloading", "resuming", "verifying", "done", "error", "cancelled")


@dataclass(slots=True)
class PullProgress:
    """One progress event of a pull; also what the server streams as SSE JSON."""

    phase: str  # one of PHASES
    name: str  # what was asked for
    file: str | None
    done_bytes: int
    total_bytes: int | None
    speed_bps: float
    eta_s: float | None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class LocalModel:
    """A model on this machine (complete, or a partial download)."""

    name: str  # alias, "ORG/REPO:QUANT", or "ORG/REPO" for safetensors
    repo_id: str | None
    quant: str | None
    format: str  # "gguf" | "safetensors"
    path: Path  # what load_model() takes: the .gguf (first part if split) or the folder
    files: list[Path] = field(default_factory=list)
    size_bytes: int = 0
    complete: bool = True
    partial_bytes: int = 0
    source: str = "localchat"  # "localchat" | "hf-cache" | "pypi" | "file"
    revision: str | None = None  # the snapshot commit, when in the HF cache

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["files"] = [str(f) for f in self.files]
        return d
