"""`localchat pull | list | rm | verify`: the model manager on the command line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from localchat.errors import ModelLoadError
from localchat.hub import LocalModel, PullProgress, list_local, pull, pull_eagle_head, remove, verify
from localchat.models.catalog import load_catalog
from localchat.models.pulls import cancelled_message

COMMANDS = {
    "pull": "download a model (alias, ORG/REPO, ORG/REPO:QUANT or ORG/REPO:FILE); resumes, checks sha256",
    "list": "list the models on this machine (and unfinished downloads)",
    "rm": "delete a model localchat downloaded (one quant, or --all of its repo)",
    "verify": "re-check the sha256 of a model's files",
}


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    for name, help_text in COMMANDS.items():
        parser = sub.add_parser(
            name, parents=[common], help=help_text, description=help_text, allow_abbrev=False
        )
        if name != "list":
            parser.add_argument("name", metavar="NAME", help="the model")
        if name == "rm":
            parser.add_argument(
                "--all", dest="whole_repo", action="store_true", help="every file of the repo"
            )
            parser.add_argument("--force", action="store_true", help="also files another tool downloaded")


def run(command: str, args: dict[str, object], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if command == "pull":
        name = str(args["name"])
        printer = ProgressPrinter(sys.stderr)
        try:
            model = pull(name, progress=printer)
            # the entry's `eagle:` head too, so that --speculative eagle runs offline
            head = pull_eagle_head(name, progress=printer)
        except KeyboardInterrupt:
            kept = cancelled_message({"file": printer.file}).removeprefix("Cancelled; ")
            print(f"\nlocalchat: interrupted; {kept} (`localchat pull {name}`)", file=sys.stderr)
            return 130
        print(model.path, file=out)
        if head is not None:
            print(f"EAGLE-3 head: {head.path}", file=out)
        return 0
    if command == "list":
        from localchat.cli.running_server import loaded_models
        from localchat.paths import home_path

        port = args.get("port")
        loaded = loaded_models(home_path(), port if isinstance(port, int) else None)
        print(format_table(list_local(), loaded), file=out)
        return 0
    if command == "rm":
        freed = remove(
            str(args["name"]), whole_repo=bool(args.get("whole_repo")), force=bool(args.get("force"))
        )
        print(f"Removed {args['name']}: {human_bytes(freed)} freed.", file=out)
        return 0
    ok, message = verify(str(args["name"]))
    print(message, file=out)
    return 0 if ok else 1


def format_table(models: list[LocalModel], loaded: set[str] | None = None) -> str:
    """The models on disk; a LOADED column only when a running localchat said what it has loaded
    (`loaded`; None: no server answered, and the CLI alone cannot know)."""
    if not models:
        return "No models yet. Get one with `localchat pull NAME` (e.g. `localchat pull qwen2.5-0.5b`)."
    header = ["NAME", "REPO", "QUANT", "SIZE", "WHERE", *(["LOADED"] if loaded is not None else []), "STATUS"]
    rows = [tuple(header)]
    kinds = _model_kinds()
    for m in models:
        status = "complete" if m.complete else f"partial {_percent(m.partial_bytes, m.size_bytes)}"
        if kinds.get(m.name, "chat") != "chat":  # embedding / rerank models are not chat models
            status += f" ({kinds[m.name]})"
        names = {m.name, m.repo_id, m.path.name, m.path.stem}
        is_loaded = ["yes" if names & loaded else "no"] if loaded is not None else []
        rows.append((m.name, m.repo_id or "—", m.quant or "—", human_bytes(m.size_bytes), f"{m.source}: {_short(m.path)}",
                     *is_loaded, status))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows
    )


def _model_kinds() -> dict[str, str]:
    """alias -> catalog type (chat, embedding, rerank); empty when the catalog cannot be read."""
    from localchat.paths import data_dir

    try:
        return {alias: entry.type for alias, entry in load_catalog(data_dir()).items()}
    except (ModelLoadError, OSError):
        return {}


class ProgressPrinter:
    """A one-line progress bar on a terminal; plain lines (each phase, every ~5 s) otherwise."""

    def __init__(self, stream: TextIO, *, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self._phase = ""
        self._last_line = 0.0
        self.file: str | None = None  # the file being downloaded, when the source names one

    def __call__(self, event: PullProgress) -> None:
        changed = event.phase != self._phase
        self._phase = event.phase
        if event.phase == "downloading":
            self.file = event.file
        if event.phase == "error":
            # The command that started the download prints the error itself ("localchat: error: ..."):
            # once is enough. Only clear the bar it would otherwise be printed after.
            if self.tty:
                self.stream.write("\r\033[K")
                self.stream.flush()
            return
        if self.tty:
            end = "\n" if event.phase in ("done", "error", "cancelled") else ""
            self.stream.write("\r\033[K" + render(event) + end)
        elif changed or time.monotonic() - self._last_line >= 5:
            self._last_line = time.monotonic()
            self.stream.write(render(event) + "\n")
        self.stream.flush()


def render(event: PullProgress) -> str:
    """`downloading  model-Q4_K_M.gguf  [#####-----]  52%  250.0 MB / 480.2 MB  31.2 MB/s  ETA 0:07`"""
    parts = [f"{event.phase:<11}", event.file or event.name]
    if event.phase in ("done", "error", "cancelled") and event.message:
        return f"{event.phase}: {event.message}"
    if event.total_bytes:
        filled = int(20 * min(event.done_bytes / event.total_bytes, 1))
        parts += ["[" + "#" * filled + "-" * (20 - filled) + "]", _percent(event.done_bytes, event.total_bytes),
                  f"{human_bytes(event.done_bytes)} / {human_bytes(event.total_bytes)}"]  # fmt: skip
    if event.phase == "downloading" and event.speed_bps > 0:
        parts.append(f"{human_bytes(int(event.speed_bps))}/s")
    if event.eta_s is not None and event.phase == "downloading":
        parts.append(f"ETA {int(event.eta_s) // 60}:{int(event.eta_s) % 60:02d}")
    elif event.message:
        parts.append(event.message)
    return "  ".join(parts)


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1000  # type: ignore[assignment]
    return f"{n} B"


def _short(path: Path) -> str:
    home = str(Path.home())
    return "~" + str(path)[len(home) :] if str(path).startswith(home + os.sep) else str(path)


def _percent(done: int, total: int) -> str:
    return f"{100 * done / total:.0f}%" if total else "?%"
