"""A command on a real pseudo-terminal, its output fed through a VT100 emulator (pyte), so tests
check what the user's screen shows, and can press keys (Ctrl-C goes through the tty as SIGINT)."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable

import pyte


class PtyTerminal:
    def __init__(self, argv: list[str], *, cwd: str, rows: int = 40, cols: int = 100) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, preexec_fn=_own_terminal
        )
        os.close(slave)
        self.master = master
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def text(self) -> str:
        return "\n".join(self.lines())

    def wait_for(self, shown: Callable[[str], bool], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while not shown(self.text()):
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed what was expected:\n{self.text()}")
            self._pump(0.05)
        return self.text()

    def _pump(self, wait: float) -> None:
        # poll, not select: a long pytest session may hold over 1024 descriptors, past select's range.
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        if poller.poll(wait * 1000):
            try:
                self.stream.feed(os.read(self.master, 65536))
            except OSError:  # the child closed the terminal
                time.sleep(wait)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)


def _own_terminal() -> None:
    # A new session whose controlling terminal is the pty: Ctrl-C typed there becomes SIGINT.
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    # As a real shell starts it: an ignored SIGINT is inherited across exec (CI's runner ignores it),
    # and Python then never turns Ctrl-C into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
