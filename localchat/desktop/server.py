"""The desktop app's server: uvicorn on a background thread (the window owns the main thread), on a
socket bound and listening before anything else, so the window can open its URL at once: connections
wait in the socket's backlog until uvicorn starts answering."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING

from localchat.errors import LocalchatError

if TYPE_CHECKING:
    from localchat.desktop.gate import DesktopGate

log = logging.getLogger(__name__)

LOADING_PAGE = "/static/loading.html"  # where the window starts (localchat/ui/static/loading.html)
# An answer still streaming at quit gets this long to notice its abort before connections are cut.
GRACE_S = 2


class PortInUseError(LocalchatError):
    status = 500
    type = "server_error"
    code = "port_in_use"


def bind_socket(host: str, port: int) -> socket.socket:
    """Port 0 lets the OS pick a free port: no conflicts, no TIME_WAIT failures on a quick relaunch."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortInUseError(
            f"Cannot listen on {host}:{port} ({exc.strerror}). Another program uses that port: close it, "
            "or pick another --port (or turn off 'serve the API' in the About dialog)."
        ) from exc
    sock.listen(128)
    return sock


class BackgroundServer:
    def __init__(self, gate: DesktopGate, sock: socket.socket, log_level: str) -> None:
        import uvicorn  # here, not at the top: the window must not wait for it

        from localchat.server.http_guard import http_protocol, install_access_log_filter

        self.gate = gate
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        config = uvicorn.Config(
            gate,
            log_level=log_level,
            log_config=None,  # records go to the root logger, so into the log file
            lifespan="on",
            timeout_graceful_shutdown=GRACE_S,
            http=http_protocol(),  # httptools (else h11), with header and idle-body timeouts
        )
        install_access_log_filter()
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="localchat-server", daemon=True)

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self.sock])
        except BaseException:
            log.exception("the server thread failed")

    def start(self, timeout_s: float = 15.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise LocalchatError("The built-in server did not start; see the log file for why.")
            time.sleep(0.01)

    def stop(self, timeout_s: float = 15.0) -> bool:
        """Stop answers in flight, shut the server and the engine down; True when it all ended in time."""
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self.sock.close()
        return not self._thread.is_alive()
