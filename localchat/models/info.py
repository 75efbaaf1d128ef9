"""Local and catalog models as plain dicts, for the management API (JSON) and the web UI's Models page:
sizes, where they are, whether they are loaded, and whether a catalog model fits in this machine's RAM."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.errors import LocalchatError
from localchat.models.catalog import load_catalog
from localchat.models.memory import GIB, MIN_KV_BUDGET, RUNTIME_OVERHEAD

if TYPE_CHECKING:
    from localchat.models.manager import ModelManager


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _as_dict(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return {k: _plain(v) for k, v in vars(obj).items() if not k.startswith("_")}


def local_models(models: ModelManager) -> list[dict[str, Any]]:
    loaded = {ctx.model_id for ctx in models.loaded}
    out = []
    for local in models.local_models():
        info = _as_dict(local)
        info["loaded"] = str(local.name) in loaded
        out.append(info)
    return out


def download_size(entry: Any) -> int | None:
    if entry.size:
        return int(entry.size)
    return int(entry.size_gb * 1e9) if entry.size_gb else None


def ram_needed(entry: Any) -> int | None:
    """The catalog's RAM estimate (`ram_gb`) when it has one, else size + a KV floor + the runtime."""
    if entry.ram_gb:
        return int(entry.ram_gb * GIB)
    size = download_size(entry)
    return size + MIN_KV_BUDGET + RUNTIME_OVERHEAD if size is not None else None


def catalog_models(models: ModelManager, available: int | None, query: str = "") -> list[dict[str, Any]]:
    try:
        catalog = load_catalog(models.data_dir)
    except LocalchatError:
        return []
    local_names = {str(m.name) for m in models.local_models() if getattr(m, "complete", True)}
    words = query.lower().split()
    out = []
    for alias, entry in catalog.items():
        info = _as_dict(entry)
        haystack = " ".join(str(info.get(k) or "") for k in ("alias", "description", "repo_id", "license"))
        if not all(w in haystack.lower() for w in words):
            continue
        need = ram_needed(entry)
        info["download_bytes"] = download_size(entry)
        info["ram_needed_bytes"] = need
        info["fits_ram"] = None if need is None or available is None else need <= available
        info["local"] = alias in local_names
        out.append(info)
    return out


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def ram_hint(info: dict[str, Any], available: int | None) -> str:
    need = info.get("ram_needed_bytes")
    if need is None or available is None:
        return ""
    verdict = "fits your RAM" if need <= available else "needs more RAM than is free"
    return f"~{human_bytes(need)}, {verdict}"  # GB like every other size on the Models page
