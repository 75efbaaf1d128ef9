"""Engine assembly: model -> runner -> engine (`engine_for`, shared with the `LLM` library API), and for
the server a `ServerContext` (the model manager calls `build_context` for each model it loads)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from localchat.backends import RunnerOptions, load_runner, resolve_backend
from localchat.config import SettingsError, resolve_backend_variables
from localchat.engine.async_engine import AsyncEngine
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative_auto import resolve_auto
from localchat.errors import LocalchatError
from localchat.mcp import McpHub, load_mcp_config
from localchat.serving.context import ServerContext
from localchat.serving.draft_model import load_draft_runner, load_eagle_proposer
from localchat.serving.mtp import load_mtp_proposer
from localchat.serving.tool_parsers import pick_parser
from localchat.settings_rules import MIN_CONTEXT_TOKENS

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.engine.config import EngineConfig
    from localchat.engine.interface import KVCacheSpec, ModelRunner
    from localchat.engine.speculative import Proposer
    from localchat.models.catalog import ResolvedModel
    from localchat.weights.bundle import ModelBundle

log = logging.getLogger("localchat")


def engine_for(
    bundle: ModelBundle,
    runner: ModelRunner,
    config: EngineConfig,
    draft_runner: ModelRunner | None = None,
    proposer: Proposer | None = None,
) -> LLMEngine:
    """The engine that drives `runner` for `bundle` (the server's and the `LLM` library API's).
    `draft_runner` / `proposer`: what --speculative draft / eagle loaded (serving/draft_model.py)."""
    tokenizer = bundle.tokenizer
    mtp = proposer is not None and config.speculative.method == "auto"  # auto attached the model's MTP head
    config = resolve_auto(config, bundle.config, runner.device_name, mtp)  # --speculative auto: pick now
    return LLMEngine(
        runner,
        tokenizer,
        config,
        eos_token_ids=bundle.config.eos_token_ids or list(tokenizer.eos_token_ids),
        model_max_len=bundle.config.max_position_embeddings,
        draft_runner=draft_runner,
        vocab_size=bundle.config.vocab_size,
        proposer=proposer,
    )


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
    from localchat.models.resolve import resolve_model
    from localchat.paths import data_dir
    from localchat.weights.loader import load_model

    resolved = target or resolve_model(
        weights=settings.weights,
        file=settings.file,
        model=settings.model,
        data_dir=data_dir(),
        progress=progress,
    )
    bundle = load_model(resolved.path, mmproj=settings.mmproj)
    aliases = [a for a in (*resolved.aliases, bundle.name, str(resolved.path)) if a != resolved.model_id]
    return bundle, resolved.model_id, aliases


def runner_options(settings: Settings) -> RunnerOptions:
    """The runner's options from the settings (also a torchrun worker rank's, which serves no HTTP).
    The backend variables are checked here, all at once: a wrong one fails before any weight is read."""
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
        pipeline_parallel_size=settings.pipeline_parallel_size,
        gpu_layers=settings.gpu_layers,
        backend_settings=resolve_backend_variables(),
    )


def build_context(
    settings: Settings,
    progress: Callable[[str], None] | None = None,
    target: ResolvedModel | None = None,
    mcp: McpHub | None = None,
) -> ServerContext:
    """Load a model (`target`, else the one the flags name) and build its engine (not started yet).
    `mcp`: the server's MCP hub, shared by all its models (else one is made from --mcp-config)."""
    from localchat.weights.chat_template import ChatTemplate

    if mcp is None and settings.mcp_config:  # read before the model loads: a bad file fails fast
        mcp = mcp_hub(settings)
    options = runner_options(settings)
    started = time.perf_counter()
    bundle, model_id, aliases = load_bundle(settings, progress, target)
    loaded = time.perf_counter()
    runner = load_runner(settings.backend, bundle, options)
    check_kv_budget(settings, runner.kv_cache_spec, bundle.config.max_position_embeddings)
    log.info(
        "model %s read in %.1fs, runner ready on %s in %.1fs",
        model_id,
        loaded - started,
        runner.device_name,
        time.perf_counter() - loaded,
    )
    draft_runner = load_draft_runner(settings, bundle, model_id, options, target, progress)
    proposer = load_eagle_proposer(settings, runner, bundle, model_id, target, progress)
    proposer = proposer or load_mtp_proposer(settings, runner, bundle, model_id)
    engine = engine_for(bundle, runner, settings.engine_config(), draft_runner, proposer)
    tokenizer = bundle.tokenizer
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
    from localchat.models.catalog import load_catalog
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
    return McpHub(load_mcp_config(settings.mcp_config))


def check_kv_budget(settings: Settings, spec: KVCacheSpec, model_max_len: int) -> None:
    """Refuse a `--kv-cache-mib` whose KV cache cannot hold a useful context for this model."""
    if settings.kv_cache_mib is None:  # sized from free memory, and capped with a log line
        return
    wanted = min(MIN_CONTEXT_TOKENS, model_max_len)
    blocks = -(-wanted // settings.block_size) + 1  # +1: the engine's null block
    per_block = spec.bytes_per_block(settings.block_size)
    needed_mib = -(-blocks * per_block // 2**20)
    if settings.kv_cache_mib < needed_mib:
        raise SettingsError(
            f"--kv-cache-mib {settings.kv_cache_mib} MiB cannot hold {wanted} tokens of this model's KV cache "
            f"({per_block / 2**20:.2f} MiB per {settings.block_size}-token block); the smallest that works is "
            f"--kv-cache-mib {needed_mib} (or leave --kv-cache-mib out to size it from free memory).",
            param="kv_cache_mib",
        )
