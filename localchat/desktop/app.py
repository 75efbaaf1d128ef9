"""The desktop app (`localchat` with no subcommand): a native window (pywebview: Qt WebEngine through
PySide6 on Linux, WebKit on macOS, WebView2 on Windows) around the same server, which runs in this
process on a background thread, on an OS-picked loopback port, locked with a per-launch API key.

The window opens at once on a loading page that polls /health, then signs in with a one-time token
and shows the chat UI. Closing the window stops answers in flight, shuts the server down and exits 0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from ctypes.util import find_library
from typing import TYPE_CHECKING, Any

# Only light imports up here: the window should not wait for the web stack (see _start_server).
from localchat.desktop.instance import InstanceLock, focus_running
from localchat.desktop.server import LOADING_PAGE, BackgroundServer, bind_socket
from localchat.desktop.state import MIN_HEIGHT, MIN_WIDTH, DesktopState
from localchat.paths import data_dir

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.desktop.gate import ASGIApp, Progress
    from localchat.desktop.selftest import SelfTest
    from localchat.models.manager import ModelManager

log = logging.getLogger(__name__)

DIST = "localchat-app"  # the PyPI name (the import package and the command are `localchat`)
INSTALL_HINT = f"pip install '{DIST}[desktop]'"
QUIT_WHILE_STREAMING = "An answer is still being written. Quit localchat anyway?"


def gui_problem() -> str | None:
    """Why no window can open here, naming what to install; None when one can."""
    if sys.platform.startswith("linux"):
        platform = os.environ.get("QT_QPA_PLATFORM", "")
        has_display = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        if not has_display and platform not in ("offscreen", "minimal", "vnc", "eglfs", "linuxfb"):
            return "there is no display (neither DISPLAY nor WAYLAND_DISPLAY is set)"
        if (
            platform in ("", "xcb")
            and not os.environ.get("WAYLAND_DISPLAY")
            and not find_library("xcb-cursor")
        ):
            # Qt aborts the whole process without it, so check before Qt starts.
            return (
                "Qt needs the system library libxcb-cursor0 (Debian/Ubuntu: sudo apt install libxcb-cursor0)"
            )
    try:
        import webview  # noqa: F401
    except ImportError as exc:
        return f"pywebview is not installed ({exc}); install it with: {INSTALL_HINT}"
    if sys.platform.startswith("linux"):
        try:
            from PySide6 import QtWebEngineWidgets  # noqa: F401
        except ImportError as exc:
            return f"Qt WebEngine for Python (PySide6) is missing ({exc}); install it with: {INSTALL_HINT}"
    return None


def _prepare_qt() -> None:
    os.environ.setdefault("QT_API", "pyside6")  # qtpy would pick PyQt (GPL) first if both are installed
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Chromium refuses to run its sandbox as root; a normal user keeps the sandbox.
        flags = os.environ.get("QTWEBENGINE_CHROMIUM_FLAGS", "")
        if "--no-sandbox" not in flags:
            os.environ["QTWEBENGINE_CHROMIUM_FLAGS"] = f"{flags} --no-sandbox".strip()


def run_desktop(
    settings: Settings, *, selftest: bool, fallback: Callable[[Settings], int], message: str = "Hi!"
) -> int:
    """The bare `localchat` command (and `--selftest`). `fallback` serves the UI to a browser."""
    problem = gui_problem()
    if problem is not None:
        if selftest:
            print(f"localchat --selftest failed: cannot open a window: {problem}", file=sys.stderr)
            return 1
        print(
            f"localchat: cannot open the desktop window: {problem}.\n"
            "localchat: opening the web UI in your browser instead.",
            file=sys.stderr,
            flush=True,
        )
        log.warning("no desktop window: %s; falling back to the browser", problem)
        return fallback(settings)
    home = data_dir()
    lock = InstanceLock(home)
    if not lock.acquire():
        if not selftest and focus_running(home):
            print("localchat is already running: its window was brought to the front.", file=sys.stderr)
            return 0
        print(
            "localchat: error: another localchat app is running with this data directory "
            f"({home}){'' if selftest else ' but did not answer'}. Close it, or pass another --home.",
            file=sys.stderr,
        )
        return 1
    try:
        return DesktopApp(settings, lock, selftest=selftest, message=message).run()
    finally:
        lock.release()


class DesktopApp:
    def __init__(self, settings: Settings, lock: InstanceLock, *, selftest: bool, message: str) -> None:
        self.lock, self.home = lock, lock.home
        self.state = DesktopState.load(self.home)
        self.selftest = selftest
        self.message = message
        self.started = time.monotonic() - _process_age_s()  # timings count from the launch itself
        self.window: Any = None
        self.models: ModelManager | None = None
        self.failures: list[str] = []
        self.server: BackgroundServer | None = None
        self.selftest_run: SelfTest | None = None
        self.server_started = threading.Event()
        # "Serve the API" off: nobody but this window knows the key or the port.
        serve_api = self.state.serve_api and not selftest
        self.settings = dataclasses.replace(
            settings,
            api_key=settings.api_key if serve_api else secrets.token_urlsafe(32),
            host=settings.host if serve_api else "127.0.0.1",
            port=settings.port if serve_api else 0,
            shutdown_timeout=0.0,  # closing the window stops answers rather than waiting for them
        )

    def _build(self, progress: Progress) -> ASGIApp:
        """The real app around a model manager: it answers at once, and finds, fetches and loads the
        model in the background, reporting that on its own /health, which the loading page polls."""
        from localchat.models.manager import ModelManager
        from localchat.server.app import create_app
        from localchat.server.web.about import DESKTOP_STATE_KEY

        progress.say("Starting the server…")
        self.models = ModelManager(self.settings)
        app = create_app(self.settings, self.models)
        app.state[DESKTOP_STATE_KEY] = self.hooks  # the About dialog shows the "serve the API" switch
        return app

    def run(self) -> int:
        """The window first (it owns the main thread), the server on a thread; both until the window closes."""
        _prepare_qt()
        import webview

        sock = bind_socket(self.settings.host, self.settings.port)  # listening: the window may connect now
        self.port = sock.getsockname()[1]
        signin, instance_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.lock.publish(self.port, instance_token)
        log.info("desktop server on 127.0.0.1:%d (serve the API: %s)", self.port, self.state.serve_api)
        # The fragment never reaches the server or its logs; the token inside is good for one sign-in.
        url = f"http://127.0.0.1:{self.port}{LOADING_PAGE}#{signin}"
        state = self.state
        self.window = webview.create_window(
            "localchat",
            url,
            width=state.width,
            height=state.height,
            x=state.x,
            y=state.y,
            min_size=(MIN_WIDTH, MIN_HEIGHT),
            text_select=True,  # False injects an inline style that the UI's CSP refuses
        )
        self.window.events.shown += self._shown
        self.window.events.resized += self._resized
        self.window.events.moved += self._moved
        signal.signal(signal.SIGTERM, lambda *_: self.window.destroy())
        starter = threading.Thread(
            target=self._start_server,
            args=(sock, signin, instance_token),
            name="localchat-start",
            daemon=True,
        )
        starter.start()
        threading.Thread(target=self._watch_streaming, name="localchat-close-guard", daemon=True).start()
        try:
            webview.start(
                self._drive_selftest if self.selftest else None,
                gui="qt" if sys.platform.startswith("linux") else None,
                private_mode=False,  # keeps the UI's localStorage (theme) between launches
                storage_path=str(self.home / "webview"),
                localization={"global.quitConfirmation": QUIT_WHILE_STREAMING},
            )
        finally:
            starter.join()
            stopped = self._shutdown(sock)
        if self.selftest_run is not None:
            return self.selftest_run.finish(stopped)
        for failure in self.failures:
            print(
                f"localchat{' --selftest failed' if self.selftest else ''}: error: {failure}", file=sys.stderr
            )
        return 0 if stopped and not self.failures and not self.selftest else 1

    def _start_server(self, sock: socket.socket, signin: str, instance_token: str) -> None:
        """On a thread, while Qt starts: the web stack's imports take a second or two."""
        try:
            from localchat.desktop.gate import DesktopGate, DesktopHooks
            from localchat.desktop.selftest import SelfTest
            from localchat.server.security import HostCheck

            self.selftest_run = SelfTest(self) if self.selftest else None
            self.hooks = DesktopHooks(
                focus=self._focus,
                set_serve_api=self._set_serve_api,
                report=self.selftest_run.report if self.selftest_run else None,
                serve_api=self.state.serve_api,
            )
            self.gate = DesktopGate(
                self._build,
                api_key=self.settings.api_key,
                signin_token=signin,
                instance_token=instance_token,
                hooks=self.hooks,
                hosts=HostCheck.from_settings(self.settings),
            )
            self.server = BackgroundServer(self.gate, sock, self.settings.log)
            self.server.start()
        except Exception as exc:
            log.exception("the built-in server did not start")
            self.failures.append(f"the built-in server did not start: {exc}")
            if self.window is not None:
                self.window.destroy()
        finally:
            self.server_started.set()

    def _drive_selftest(self) -> None:
        self.server_started.wait(60)
        if self.selftest_run is not None and not self.failures:
            self.selftest_run.run()
        elif self.window is not None:
            self.window.destroy()

    # -- window events (any thread) -------------------------------------------------------------------

    def _shown(self) -> None:
        self.shown_after = time.monotonic() - self.started
        log.info("window shown %.2fs after launch", self.shown_after)

    def _resized(self, width: int, height: int) -> None:
        self.state.width, self.state.height = max(int(width), MIN_WIDTH), max(int(height), MIN_HEIGHT)

    def _moved(self, x: int, y: int) -> None:
        self.state.x, self.state.y = int(x), int(y)

    def _focus(self) -> None:
        window = self.window
        if window is None:
            return
        window.restore()
        window.show()
        window.on_top = True  # raise above other apps, then behave like a normal window again
        window.on_top = False

    def _set_serve_api(self, on: bool) -> None:
        # Saved now, applied at the next launch: the running server's port and key cannot change.
        saved = DesktopState.load(self.home)
        saved.serve_api = self.state.serve_api = on
        saved.save(self.home)
        log.info("serve the API set to %s (from the next launch)", on)

    def _watch_streaming(self) -> None:
        """Ask before closing only while an answer streams (pywebview reads the flag at close time)."""
        while self.window is not None:
            models = self.models
            streaming = models is not None and any(ctx.engine.num_in_flight for ctx in models.loaded)
            self.window.confirm_close = streaming and not self.selftest
            time.sleep(0.2)

    def _shutdown(self, sock: socket.socket) -> bool:
        models, started = self.models, time.monotonic()
        if models is not None:
            models.shutdown(0)  # aborts answers in flight so their streams end now; cancels downloads
        stopped = self.server.stop() if self.server is not None else False
        sock.close()
        self.window = None
        try:
            self.state.save(self.home)
        except OSError as exc:
            log.warning("could not save the window size and position: %s", exc)
        log.info(
            "server stopped %.2fs after the window closed (clean: %s)", time.monotonic() - started, stopped
        )
        return stopped


def _process_age_s() -> float:
    """Seconds since this process started (Linux: from /proc, so the interpreter's start-up counts too);
    elsewhere 0, i.e. timings start when the desktop app does."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
