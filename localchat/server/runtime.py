"""Assembling and running a server: model -> runner -> engine -> `ServerContext` (the model manager
calls `build_context` for each model it loads), then uvicorn with graceful shutdown (SIGINT/SIGTERM:
stop taking requests, let in-flight ones end, exit 0). The server listens before any model is ready."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import uvicorn

from localchat.engine.async_engine import AsyncEngine
from localchat.engine.engine import LLMEngine
from localchat.errors import LocalchatError
from localchat.loopback import is_loopback_host
from localchat.server import preflight
from localchat.server.context import ServerContext
from localchat.server.http_guard import GuardedH11Protocol, install_access_log_filter

if TYPE_CHECKING:
    from localchat.backends import RunnerOptions
    from localchat.catalog import ResolvedModel
    from localchat.config import Settings
    from localchat.embeddings.model import EmbeddingModel
    from localchat.mcp import McpHub
    from localchat.model_manager import ModelManager
    from localchat.weights.bundle import ModelBundle

log = logging.getLogger("localchat")


def load_bundle(
    settings: Settings,
    progress: Callable[[str], None] | None = None,
    target: ResolvedModel | None = None,
) -> tuple[ModelBundle, str, list[str]]:
    """(model, id shown to clients, other accepted names): `target`, else what the model flags name.
    The fake backend needs no weights (a target then only gives the fake model its name)."""
    if settings.backend == "fake":
        from localchat.backends.fake import fake_model_bundle

        return fake_model_bundle(), target.model_id if target else "fake-model", []
    from localchat.catalog import resolve_model
    from localchat.paths import data_dir
    from localchat.weights.loader import load_model

    resolved = target or resolve_model(
        weights=settings.weights,
        file=settings.file,
        model=settings.model,
        data_dir=data_dir(),
        progress=progress,
    )
    bundle = load_model(resolved.path)
    aliases = [a for a in (*resolved.aliases, bundle.name, str(resolved.path)) if a != resolved.model_id]
    return bundle, resolved.model_id, aliases


def runner_options(settings: Settings) -> RunnerOptions:
    """The runner's options from the settings (also a torchrun worker rank's, which serves no HTTP)."""
    from localchat.backends import RunnerOptions

    return RunnerOptions(
        device=settings.device,
        dtype=settings.dtype,
        seed=settings.seed,
        num_threads=settings.threads,
        cuda_graphs=settings.cuda_graphs,
        isq=settings.isq,
        kv_cache_dtype=settings.kv_cache_dtype,
        tensor_parallel_size=settings.tensor_parallel_size,
        device_ids=tuple(int(i) for i in settings.device_ids.split(",") if i.strip()) or None,
    )


def build_context(
    settings: Settings,
    progress: Callable[[str], None] | None = None,
    target: ResolvedModel | None = None,
    mcp: McpHub | None = None,
) -> ServerContext:
    """Load a model (`target`, else the one the flags name) and build its engine (not started yet).
    `mcp`: the server's MCP hub, shared by all its models (else one is made from --mcp-config)."""
    from localchat.backends import load_runner, resolve_backend
    from localchat.server.tool_parsers import pick_parser
    from localchat.weights.chat_template import ChatTemplate

    if mcp is None and settings.mcp_config:  # read before the model loads: a bad file fails fast
        mcp = mcp_hub(settings)
    started = time.perf_counter()
    bundle, model_id, aliases = load_bundle(settings, progress, target)
    loaded = time.perf_counter()
    options = runner_options(settings)
    runner = load_runner(settings.backend, bundle, options)
    preflight.check_kv_budget(settings, runner.kv_cache_spec, bundle.config.max_position_embeddings)
    log.info(
        "model %s read in %.1fs, runner ready on %s in %.1fs",
        model_id,
        loaded - started,
        runner.device_name,
        time.perf_counter() - loaded,
    )
    from localchat.server.draft_model import load_draft_runner

    draft_runner = load_draft_runner(settings, bundle, model_id, options, target, progress)
    tokenizer = bundle.tokenizer
    engine = LLMEngine(
        runner,
        tokenizer,
        settings.engine_config(),
        eos_token_ids=bundle.config.eos_token_ids or list(tokenizer.eos_token_ids),
        model_max_len=bundle.config.max_position_embeddings,
        draft_runner=draft_runner,
        vocab_size=bundle.config.vocab_size,
    )
    template = ChatTemplate(
        bundle.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
    )
    return ServerContext(
        settings,
        AsyncEngine(engine),
        bundle,
        model_id,
        template,
        model_aliases=aliases,
        backend_name=resolve_backend(settings.backend),
        tool_parser=pick_parser(settings.tool_call_parser, template.source, _catalog_tool_format(settings)),
        mcp=mcp,
    )


def _catalog_tool_format(settings: Settings) -> str | None:
    """The `tool_call` field of the models.yaml entry the model was named by, if any."""
    if not settings.model or settings.backend == "fake":
        return None
    from localchat.catalog import load_catalog
    from localchat.errors import LocalchatError
    from localchat.paths import data_dir

    try:
        entry = load_catalog(data_dir()).get(settings.model)
    except LocalchatError:
        return None
    # NOTE: getattr: the field arrives with the catalog's own change; without it, the template decides.
    hint = getattr(entry, "tool_call", None)
    return hint if isinstance(hint, str) else None


def mcp_hub(settings: Settings) -> McpHub | None:
    """The MCP hub --mcp-config describes (not started), or None."""
    if not settings.mcp_config:
        return None
    from localchat.mcp import McpHub, load_mcp_config

    return McpHub(load_mcp_config(settings.mcp_config))


def security_warning(settings: Settings) -> str | None:
    if is_loopback_host(settings.host) or settings.api_key:
        return None
    bar = "!" * 78
    return (
        f"{bar}\n  WARNING: localchat is listening on {settings.host}, reachable from other machines,\n"
        "  and NO API KEY is set: anyone who can reach this port can use the model.\n"
        f"  Set --api-key (or LOCALCHAT_API_KEY), or bind 127.0.0.1.\n{bar}"
    )


class _Server(uvicorn.Server):
    """uvicorn, except that a handled SIGINT/SIGTERM ends in exit code 0 instead of being re-raised."""

    def __init__(self, config: uvicorn.Config, models: ModelManager) -> None:
        super().__init__(config)
        self.models = models
        self.exit_code = 0

    def fail(self, exc: LocalchatError) -> None:
        """The start-up model could not be loaded: say why and stop (from the loading thread)."""
        print(f"localchat: error: {exc.message}", file=sys.stderr, flush=True)
        self.exit_code = 1
        self.should_exit = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.models.draining = True  # new requests on open connections get 503 while in-flight ones finish
        for ctx in self.models.loaded:
            ctx.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # NOTE: uvicorn re-raises captured signals after shutdown (exit 130/143); the shutdown was
            # graceful, so forget them.
            self._captured_signals.clear()


def serve(
    settings: Settings,
    models: ModelManager | ServerContext,
    *,
    open_browser: bool = False,
    exit_on_startup_error: bool = True,
    encoders: list[EmbeddingModel] | None = None,
) -> int:
    """Run the server until SIGINT/SIGTERM (exit code 0), or until the start-up model fails to load
    (exit code 1, the reason on stderr) unless `exit_on_startup_error` is off (then /health says it).
    `models`: the manager, or one already built context (it becomes the manager's only model)."""
    from localchat.model_manager import ModelManager
    from localchat.server.app import create_app

    if not isinstance(models, ModelManager):
        models = ModelManager.preloaded(settings, models)

    if (warning := security_warning(settings)) is not None:
        print(warning, file=sys.stderr, flush=True)
        log.warning("listening on %s without an API key", settings.host)
    app = create_app(settings, models, encoders)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log,
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        lifespan="on",
        http=GuardedH11Protocol,  # header and idle-body timeouts
    )
    install_access_log_filter()  # after the Config: building it configured uvicorn's loggers
    server = _Server(config, models)
    if exit_on_startup_error:
        models.on_startup_error = server.fail
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else host}:{settings.port}/"
    threading.Thread(target=_announce, args=(server, url, open_browser, settings.ui), daemon=True).start()
    server.run()
    return server.exit_code


def _announce(server: uvicorn.Server, url: str, open_browser: bool, ui: bool = True) -> None:
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if not server.started:
        return
    if ui:
        print(f"localchat is serving at {url} (OpenAI API at {url}v1)", file=sys.stderr, flush=True)
    else:  # no page to open at the root: name only what answers
        print(
            f"localchat is serving the OpenAI API at {url}v1 (no web UI: --no-ui)",
            file=sys.stderr,
            flush=True,
        )
    if open_browser:
        preflight.open_browser(url)
