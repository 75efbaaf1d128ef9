"""Hugging Face settings, read when used (not at import) so one process can honour changes.

The variables mean what they mean to huggingface_hub: HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, HF_TOKEN,
HF_HUB_OFFLINE, HF_HUB_DOWNLOAD_TIMEOUT. Proxies (HTTPS_PROXY, ...) are honoured by its HTTP session.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "true", "yes", "on"}


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir() -> Path:
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def token() -> str | None:
    """HF_TOKEN, else the token `hf auth login` stored."""
    if value := os.environ.get("HF_TOKEN"):
        return value.strip() or None
    from huggingface_hub import get_token

    return get_token()


def read_timeout_s() -> float:
    """How long a connection may stay silent before it counts as stalled and is retried."""
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT", "10"))
    except ValueError:
        return 10.0
