"""What the desktop app remembers between launches (`<data dir>/desktop.json`): the window's size and
position, and whether other programs may use the API ("serve the API")."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

log = logging.getLogger(__name__)

STATE_FILE = "desktop.json"
MIN_WIDTH, MIN_HEIGHT = 480, 360


@dataclass(slots=True)
class DesktopState:
    width: int = 1100
    height: int = 780
    x: int | None = None  # None: the window system places it
    y: int | None = None
    # Off: a random per-launch key and an OS-picked port, so only the window can use the server.
    # On: the configured --port and --api-key, so other local programs can use the API too.
    serve_api: bool = False

    @classmethod
    def load(cls, home: Path) -> DesktopState:
        path = home / STATE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:  # a damaged file must not stop the app from opening
            log.warning("ignoring %s: %s", path, exc)
            return cls()
        known = {f.name: f.type for f in fields(cls)}
        state = cls()
        for name, value in raw.items() if isinstance(raw, dict) else ():
            if name == "serve_api" and isinstance(value, bool):
                state.serve_api = value
            elif name in known and (
                value is None or (isinstance(value, int) and not isinstance(value, bool))
            ):
                setattr(state, name, value)
        state.width, state.height = max(state.width or 0, MIN_WIDTH), max(state.height or 0, MIN_HEIGHT)
        return state

    def save(self, home: Path) -> None:
        """Atomically: a crash mid-write leaves the previous file, never half of one."""
        home.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".desktop-", suffix=".json", dir=home)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(asdict(self), out, indent=2)
            os.replace(tmp, home / STATE_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
