"""Desktop app launch benchmark: time to window, time to a usable chat UI, first answer, and memory with
the window open (the app's process plus its Qt WebEngine processes), over a few launches.

python benchmarks/desktop_bench.py --f .models/SmolLM2-135M-Instruct.Q4_1.gguf [--runs 3] [--display offscreen|:99]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
PASSED = re.compile(r"window after ([\d.]+)s, chat UI usable after ([\d.]+)s, answer rendered in ([\d.]+)s")


def _env(home: str, display: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALCHAT_")}
    env.update(LOCALCHAT_HOME=home)
    if display == "offscreen":
        env.pop("DISPLAY", None)
        env["QT_QPA_PLATFORM"] = "offscreen"
    else:
        env.pop("QT_QPA_PLATFORM", None)
        env["DISPLAY"] = display
    return env


def selftest(model: list[str], display: str) -> tuple[float, float, float, float]:
    """(window s, usable s, answer s, wall s from the process start) from one `--selftest` launch."""
    with tempfile.TemporaryDirectory() as home:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "localchat", "--selftest", *model],
            cwd=REPO, env=_env(home, display), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        wall = time.monotonic() - started
    match = PASSED.search(done.stdout)
    if done.returncode != 0 or not match:
        raise SystemExit(f"selftest failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    window, usable, answer = (float(g) for g in match.groups())
    return window, usable, answer, wall


def memory_with_window_open(model: list[str], display: str) -> tuple[float, float]:
    """(app process RSS MiB, total RSS MiB with the web engine's processes), window idle on the chat UI."""
    with tempfile.TemporaryDirectory() as home:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localchat", *model], cwd=REPO, env=_env(home, display),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            log = Path(home) / "logs" / "localchat.log"
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if log.exists() and re.search(r'"GET / HTTP/1.1" 200', log.read_text()):
                    break
                time.sleep(0.2)
            time.sleep(3)  # let the page settle
            main = psutil.Process(proc.pid)
            processes = [main, *main.children(recursive=True)]
            rss = [p.memory_info().rss for p in processes]
            return rss[0] / 2**20, sum(rss) / 2**20
        finally:
            proc.terminate()
            proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--f", dest="file", help="a GGUF file (default: --backend fake)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--display", default="offscreen", help="offscreen, or an X display such as :99")
    args = parser.parse_args()
    model = ["--f", args.file] if args.file else ["--backend", "fake"]
    rows = [selftest(model, args.display) for _ in range(args.runs)]
    app_rss, total_rss = memory_with_window_open(model, args.display)
    print(f"| launch ({args.runs} runs, {args.display}) | median | min | max |")
    print("|---|---|---|---|")
    for i, name in enumerate(["time to window (s)", "time to usable chat UI (s)", "first answer (s)",
                              "selftest wall time incl. interpreter start (s)"]):  # fmt: skip
        values = [r[i] for r in rows]
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    print(
        f"\nRSS with the window open: app process {app_rss:.0f} MiB, with web engine processes {total_rss:.0f} MiB"
    )


if __name__ == "__main__":
    main()
