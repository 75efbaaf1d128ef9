"""A check that turns a server that cannot work into a one-line message at startup: the port is free
(checked before the model loads, which takes seconds to minutes; the KV budget is checked where the
engine is assembled, in `serving.assembly`). Plus opening the browser, which fails quietly on headless
machines."""

from __future__ import annotations

import errno
import socket
import sys
import webbrowser

from localchat.config import SettingsError
from localchat.errors import LocalchatError

# Windows reports these as WSA codes.
_IN_USE = {errno.EADDRINUSE, 10048}
_NO_RIGHTS = {errno.EACCES, 10013}
_NOT_HERE = {errno.EADDRNOTAVAIL, 10049}


class PortUnavailableError(LocalchatError):
    status = 500
    type = "server_error"
    code = "port_unavailable"


def check_port(host: str, port: int) -> None:
    """Bind and release `host:port` the way uvicorn will, and say what to do when that fails."""
    if port == 0:  # the OS picks a free one
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if sys.platform != "win32":  # as uvicorn: a closed socket's TIME_WAIT does not count as in use
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise _bind_error(host, port, exc) from None


def _bind_error(host: str, port: int, exc: OSError) -> LocalchatError:
    code = getattr(exc, "winerror", None) or exc.errno
    if code in _IN_USE:
        return PortUnavailableError(
            f"port {port} is in use; pass --p PORT (another program, maybe another localchat, "
            f"listens on {host}:{port})."
        )
    if code in _NO_RIGHTS:
        return PortUnavailableError(f"port {port} needs administrator rights; pass --p PORT above 1023.")
    if code in _NOT_HERE or isinstance(exc, socket.gaierror):
        return SettingsError(
            f"--host {host!r} is not an address of this machine ({exc.strerror or exc}); "
            "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface).",
            param="host",
        )
    return PortUnavailableError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pass --p PORT.")


def open_browser(url: str) -> None:
    """Open `url`, or say how to when there is no browser (a headless machine, an SSH session)."""
    try:
        opened = webbrowser.open(url)
    except webbrowser.Error:
        opened = False
    if not opened:
        print(
            f"localchat: no browser could be opened here; open {url} in your browser",
            file=sys.stderr,
            flush=True,
        )
