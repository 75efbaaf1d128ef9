"""Where localchat keeps its state: the platformdirs user data dir, or $LOCALCHAT_HOME when set."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    override = os.environ.get("LOCALCHAT_HOME")
    path = Path(override).expanduser() if override else Path(platformdirs.user_data_dir("localchat", False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Models localchat fetched itself (not from the Hugging Face cache)."""
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
