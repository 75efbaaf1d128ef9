"""Reading a package index's project page (PEP 691 JSON or PEP 503 HTML) into wheel links; shared by
the pip configuration reader (`pip_config`) and the wheel puller (`pypi`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import urljoin

_HREF = re.compile(r"<a\s[^>]*href=[\"']([^\"']+)[\"'][^>]*>\s*([^<]+?)\s*</a>", re.IGNORECASE)
JSON_ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
)


@dataclass(frozen=True, slots=True)
class WheelLink:
    filename: str
    url: str  # http(s):// or file://
    sha256: str | None
    size: int | None


def parse_simple_page(body: str, content_type: str, base_url: str) -> list[WheelLink]:
    """Files listed by a simple-index project page (PEP 691 JSON or PEP 503 HTML)."""
    links = []
    if "json" in content_type:
        for f in json.loads(body).get("files", []):
            url = urljoin(base_url, f["url"])
            links.append(WheelLink(f["filename"], url, (f.get("hashes") or {}).get("sha256"), f.get("size")))
        return links
    for href, text in _HREF.findall(body):
        url, _, fragment = urljoin(base_url, href.replace("&amp;", "&")).partition("#")
        sha = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        links.append(WheelLink(text.strip(), url, sha, None))
    return links
