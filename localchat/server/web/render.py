"""Templates and HTML responses for the web UI: where `localchat/ui/` lives, the Jinja2 environment (autoescaped),
and the security headers every page carries."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import Response
from litestar.enums import MediaType
from markupsafe import Markup

from localchat.models.info import human_bytes

# htmx runs with allowEval off, so no 'unsafe-eval'; nothing inline, so no 'unsafe-inline' either.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it Chromium sends `Origin: null` on the page's own form POST (the login),
    # which the security gate cannot tell from a sandboxed page elsewhere. same-origin sends the
    # Origin, and still no Referer to other sites.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


# The assets under /static: the same CSP (loading.html is a page), and never sniffed as something else.
STATIC_HEADERS = {k: v for k, v in SECURITY_HEADERS.items() if k != "Cache-Control"}


def ui_dir() -> Path:
    """The web UI's templates and static files, package data of `localchat` (a checkout and a wheel alike)."""
    packaged = Path(str(resources.files("localchat"))) / "ui"
    if not (packaged / "templates").is_dir():
        raise FileNotFoundError(f"The web UI files are missing from {packaged}: reinstall localchat.")
    return packaged


def _tokens_per_s(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


@cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(ui_dir() / "templates"),
        autoescape=True,  # every template, whatever its extension
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["tps"] = _tokens_per_s
    env.filters["filesize"] = human_bytes
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def macro(name: str, *args: Any, **kwargs: Any) -> str:
    """Render one macro of `_partials.html` (a message, a sidebar item...) on its own."""
    module = environment().get_template("_partials.html").module  # built once, cached by Jinja
    return str(getattr(module, name)(*args, **kwargs))


def models_macro(name: str, *args: Any, **kwargs: Any) -> str:
    """One macro of `_models.html` (the Models page's pieces and the model status partial)."""
    module = environment().get_template("_models.html").module
    return str(getattr(module, name)(*args, **kwargs))


def html(body: str | Markup, *, status: int = 200, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(
        content=str(body),
        status_code=status,
        media_type=MediaType.HTML,
        headers={**SECURITY_HEADERS, **(headers or {})},
    )
