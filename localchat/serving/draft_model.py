"""Loading the draft model of `--speculative draft` beside the target: which model (--draft-model, else
the target's models.yaml `draft`), its vocabulary checked against the target's, and its own runner on
the same backend (engine/draft_model.py runs it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from localchat.config import SettingsError

if TYPE_CHECKING:
    from localchat.backends import RunnerOptions
    from localchat.config import Settings
    from localchat.engine.interface import ModelRunner
    from localchat.models.catalog import ResolvedModel
    from localchat.weights.bundle import ModelBundle

log = logging.getLogger("localchat")


def draft_model_name(settings: Settings, target: ResolvedModel | None) -> str | None:
    """--draft-model, else the `draft` of the catalog entry the target was named by."""
    if settings.draft_model:
        return settings.draft_model
    from localchat.errors import LocalchatError
    from localchat.models.catalog import load_catalog
    from localchat.paths import data_dir

    names = [
        n for n in (settings.model, *(target.aliases if target else ()), target and target.model_id) if n
    ]
    try:
        catalog = load_catalog(data_dir())
    except LocalchatError:
        return None
    for name in names:
        entry = catalog.get(name)
        if entry is not None and entry.draft:
            return entry.draft
    return None


def load_draft_runner(
    settings: Settings,
    target_bundle: ModelBundle,
    target_id: str,
    options: RunnerOptions,
    target: ResolvedModel | None = None,
    progress: Callable[[str], None] | None = None,
) -> ModelRunner | None:
    """The draft model's runner, or None unless --speculative draft. Raises a typed error when no draft
    is named or its vocabulary is not the target's."""
    if settings.speculative != "draft" or settings.backend == "fake":
        return None
    from dataclasses import replace

    from localchat.backends import load_runner
    from localchat.models.resolve import resolve_model
    from localchat.paths import data_dir
    from localchat.weights.draft_vocab import check_draft_vocabulary
    from localchat.weights.loader import load_model

    name = draft_model_name(settings, target)
    if not name:
        raise SettingsError(
            f"--speculative draft needs a draft model: pass --draft-model NAME|PATH (a smaller model with "
            f"the vocabulary of {target_id}), or use --speculative ngram.",
            param="draft_model",
        )
    resolved = resolve_model(model=name, data_dir=data_dir(), progress=progress)
    bundle = load_model(resolved.path)
    check_draft_vocabulary(target_bundle.tokenizer, bundle.tokenizer, target_id, resolved.model_id)
    # One rank: the draft is small, and its passes are latency-bound.
    runner = load_runner(
        settings.backend,
        bundle,
        replace(options, tensor_parallel_size=1, pipeline_parallel_size=1, gpu_layers=None),
    )
    log.info("draft model %s ready on %s", resolved.model_id, runner.device_name)
    return runner
