"""The `localchat` command (also `python -m localchat`).

    localchat serve [flags]      the OpenAI-compatible API (+ the web UI unless --no-ui)
    localchat chat [flags]       a terminal chat, on the local model or `--url` any OpenAI server
    localchat pull NAME          download a model (see `localchat pull --help`); also list, rm, verify
    localchat --ui-server        serve and open the web UI in a browser
    localchat                    the desktop app: a native window around the same server
    localchat --selftest         open the window, chat once through it, close; exit 0 or say what failed

Every flag also reads a LOCALCHAT_* environment variable (see `localchat.config`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from localchat import __version__
from localchat.cli import models as cli_models
from localchat.config import BACKEND_VARIABLES, SETTINGS_SPEC, Settings, SettingsError
from localchat.errors import LocalchatError
from localchat.hub import find_local, pull
from localchat.hub.spec import is_repo_name
from localchat.logs import setup_logging
from localchat.models.catalog import load_catalog
from localchat.paths import data_dir, is_in_data_dir, unusable_data_dir
from localchat.server.preflight import check_port

GROUP_TITLES = {
    "model": "model",
    "server": "server",
    "engine": "engine",
    "sampling": "default sampling (a request's own values win)",
    "chat": "terminal chat",
}
COMMANDS = {
    "serve": "serve the OpenAI-compatible API (and the web UI unless --no-ui)",
    "chat": "chat in the terminal with the local model, or with --url any OpenAI-compatible server",
}


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    groups = {key: parser.add_argument_group(title) for key, title in GROUP_TITLES.items()}
    for spec in SETTINGS_SPEC:
        kwargs: dict[str, Any] = {
            "dest": spec.name,
            "default": argparse.SUPPRESS,
            "help": f"{spec.help} [{spec.env}]",
        }
        if spec.action in ("store_true", "store_false"):
            kwargs["action"] = spec.action
        else:
            kwargs["type"] = spec.parse if spec.action != "append" else str
            if spec.action == "append":
                kwargs["action"] = "append"
            if spec.metavar:
                kwargs["metavar"] = spec.metavar
            if spec.choices:
                kwargs["choices"] = spec.choices
        groups[spec.group].add_argument(*spec.flags, **kwargs)


def _backend_variables_help() -> str:
    lines = [f"  {v.env}={'|'.join(v.choices) or v.default}: {v.help}" for v in BACKEND_VARIABLES]
    return "torch backend tuning (environment variables, docs/backends.md):\n" + "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_setting_flags(common)
    parser = argparse.ArgumentParser(
        prog="localchat",
        description="A local LLM chat app: OpenAI-compatible server, web UI and terminal chat.",
        epilog=_backend_variables_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the epilog's one line per variable
        parents=[common],
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"localchat {__version__}")
    parser.add_argument("--ui-server", action="store_true", help="serve and open the web UI in a browser")
    parser.add_argument(
        "--selftest",
        action="store_true",
        help="open the desktop window, send one chat message through it, check the answer, close",
    )
    sub = parser.add_subparsers(dest="command", metavar="{serve,chat,pull,list,rm,verify}")
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, parents=[common], help=help_text, description=help_text, allow_abbrev=False)
    cli_models.add_parsers(sub, common)
    return parser


def parse_settings(
    argv: Sequence[str] | None, environ: dict[str, str] | None = None
) -> tuple[str | None, bool, Settings]:
    """(command, --ui-server, settings) from the command line and the environment."""
    command, mode, settings = parse_mode(argv, environ)
    return command, mode == "ui-server", settings


def parse_mode(
    argv: Sequence[str] | None, environ: dict[str, str] | None = None
) -> tuple[str | None, str, Settings]:
    """(command, mode, settings); mode is "ui-server", "selftest" or "desktop" (the bare command)."""
    args = vars(build_parser().parse_args(argv))
    command, ui_server = args.pop("command", None), args.pop("ui_server", False)
    selftest = args.pop("selftest", False)
    mode = "ui-server" if ui_server else "selftest" if selftest else "desktop"
    return command, mode, Settings.load(args, environ)


def _serve(settings: Settings, *, open_browser: bool) -> int:
    from localchat.models.manager import ModelManager
    from localchat.server.runtime import serve

    if settings.ui is False and open_browser:
        raise SettingsError("--ui-server needs the web UI; drop --no-ui.", param="ui")
    world = settings.tensor_parallel_size * settings.pipeline_parallel_size
    if world > 1:  # under torchrun, ranks >= 1 serve rank 0's steps, not HTTP
        from localchat.backends import serve_torchrun_worker
        from localchat.serving.assembly import load_bundle, runner_options

        # The worker's options and model come from here, the app layer: the backend never imports it.
        options = runner_options(settings)
        exit_code = serve_torchrun_worker(world, options, lambda: load_bundle(settings)[0])
        if exit_code is not None:
            return exit_code
    check_port(settings.host, settings.port)  # a taken port fails now, not after the browser opened
    if settings.file or settings.weights:  # a mistyped path fails now, not as a /health error later
        from localchat.models.resolve import resolve_model

        resolve_model(file=settings.file, weights=settings.weights)
    elif settings.backend != "fake":  # models are looked up (and fetched) in the data dir: it must work
        from localchat.paths import data_dir

        home = data_dir()
        if settings.model:  # a typo fails now with suggestions, not as a download that "did not finish"
            from localchat.models.catalog import load_catalog
            from localchat.models.resolve import check_model_name

            check_model_name(settings.model, load_catalog(home))
    # The server listens at once; the model is found, fetched if needed (the progress bar here, and in
    # GET /health and the web UI) and loaded in the background.
    encoders = []
    if settings.embedding_model or settings.rerank_model:  # small: loaded before listening, errors exit 1
        from localchat.embeddings.model import load_side_models

        encoders = load_side_models(settings.embedding_model, settings.rerank_model, settings.threads)
    models = ModelManager(settings, startup_progress=cli_models.ProgressPrinter(sys.stderr))
    return serve(settings, models, open_browser=open_browser, encoders=encoders)


def _pull_model_flag(settings: Settings) -> None:
    """`--m ORG/REPO[:QUANT]` or an alias that is not on disk yet: pull it first, with the progress bar."""
    if settings.model is None or settings.backend == "fake" or settings.url:
        return
    name = settings.model
    if (name in load_catalog(data_dir()) or is_repo_name(name)) and find_local(name) is None:
        pull(name, progress=cli_models.ProgressPrinter(sys.stderr))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        command, mode, settings = parse_mode(argv)
    except SettingsError as exc:
        print(f"localchat: error: {exc.message}", file=sys.stderr)
        return 2
    if settings.home:
        os.environ["LOCALCHAT_HOME"] = settings.home  # paths.data_dir() reads it
    setup_logging(settings.log)
    try:
        if command in cli_models.COMMANDS:
            return cli_models.run(command, vars(build_parser().parse_args(argv)))
        if command == "serve":
            return _serve(settings, open_browser=False)
        if command == "chat":
            from localchat.cli.terminal_chat import run_chat

            _pull_model_flag(settings)
            return run_chat(settings)
        if mode == "ui-server":
            return _serve(settings, open_browser=settings.open_browser)
        from localchat.desktop.app import run_desktop

        return run_desktop(
            settings, selftest=mode == "selftest", fallback=lambda s: _serve(s, open_browser=s.open_browser)
        )
    except LocalchatError as exc:
        print(f"localchat: error: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file the user can fix (disk full, permissions): a message, not a traceback
        logging.getLogger("localchat").debug("startup failed", exc_info=exc)
        message = unusable_data_dir(exc).message if is_in_data_dir(exc.filename) else str(exc)
        print(f"localchat: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
