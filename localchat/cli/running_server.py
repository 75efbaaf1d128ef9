"""What a running localchat has loaded, for `localchat list`: asked over HTTP, since only the server knows.

Two places to look: the desktop app's single-instance file (its OS-picked port) and the `serve` port
(--p / LOCALCHAT_PORT, else 8000). /health needs no key and names the loaded models; a port where
something else answers (not localchat's JSON) counts as no server.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from localchat.desktop.instance import INFO_FILE

DEFAULT_PORT = 8000
TIMEOUT_S = 0.5  # `list` must not hang on a port that does not answer


def candidate_ports(home: Path, port: int | None) -> list[int]:
    ports: list[int] = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # no desktop app running
        ports.append(int(json.loads((home / INFO_FILE).read_text(encoding="utf-8"))["port"]))
    env_port = os.environ.get("LOCALCHAT_PORT", "")
    serve_port = port if port is not None else int(env_port) if env_port.isdigit() else DEFAULT_PORT
    if serve_port not in ports:
        ports.append(serve_port)
    return ports


def loaded_models(home: Path, port: int | None = None) -> set[str] | None:
    """The ids and aliases a running localchat has loaded, or None when no localchat answers."""
    import httpx

    for candidate in candidate_ports(home, port):
        try:
            body = httpx.get(f"http://127.0.0.1:{candidate}/health", timeout=TIMEOUT_S).json()
        except (httpx.HTTPError, ValueError):
            continue
        if isinstance(body, dict) and isinstance(body.get("loaded"), list):
            return {str(x) for x in body["loaded"]} | ({str(body["model"])} if body.get("model") else set())
        if isinstance(body, dict) and body.get("status") in ("loading", "downloading", "no_model"):
            return set()  # localchat, with nothing loaded yet
    return None
