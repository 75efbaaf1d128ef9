"""Loading the draft model of `--speculative draft` beside the target: which model (--draft-model, else
the target's models.yaml `draft`), its vocabulary checked against the target's, and its own runner on
the same backend (engine/draft_model.py runs it). `--speculative eagle`: the EAGLE-3 head (--draft-model,
else the target's models.yaml `eagle`), attached to the target's runner (torch only)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.backends import load_runner
from localchat.config import SettingsError
from localchat.errors import LocalchatError

if TYPE_CHECKING:
    from localchat.backends import RunnerOptions
    from localchat.config import Settings
    from localchat.engine.interface import ModelRunner
    from localchat.engine.speculative import Proposer
    from localchat.models.catalog import ResolvedModel
    from localchat.weights.bundle import ModelBundle

log = logging.getLogger("localchat")


def draft_model_name(settings: Settings, target: ResolvedModel | None, key: str = "draft") -> str | None:
    """--draft-model, else the `draft` (or `key`: "eagle") of the catalog entry the target was named by."""
    if settings.draft_model:
        return settings.draft_model
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
        if entry is not None and getattr(entry, key):
            return str(getattr(entry, key))
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
    name = draft_model_name(settings, target)
    return draft_runner_for(name, settings.backend, target_bundle, target_id, options, progress)


def draft_runner_for(
    name: str | None,
    backend: str,
    target_bundle: ModelBundle,
    target_id: str,
    options: RunnerOptions,
    progress: Callable[[str], None] | None = None,
) -> ModelRunner:
    """Load the draft model `name` on `backend` after checking its vocabulary against the target's."""
    from dataclasses import replace

    from localchat.weights.draft_vocab import check_draft_vocabulary
    from localchat.weights.loader import load_model

    if not name:
        raise SettingsError(
            f"--speculative draft needs a draft model: pass --draft-model NAME|PATH (a smaller model with "
            f"the vocabulary of {target_id}), or use --speculative ngram.",
            param="draft_model",
        )
    resolved = _resolve(name, progress)
    bundle = load_model(resolved.path)
    check_draft_vocabulary(target_bundle.tokenizer, bundle.tokenizer, target_id, resolved.model_id)
    # One rank: the draft is small, and its passes are latency-bound.
    runner = load_runner(backend, bundle, replace(options, tensor_parallel_size=1))
    log.info("draft model %s ready on %s", resolved.model_id, runner.device_name)
    return runner


def _resolve(name: str, progress: Callable[[str], None] | None) -> ResolvedModel:
    """A models.yaml name, path or repo as a local path, pulled if missing."""
    from localchat.models.resolve import resolve_model
    from localchat.paths import data_dir

    return resolve_model(model=name, data_dir=data_dir(), progress=progress)


def load_eagle_proposer(
    settings: Settings,
    runner: ModelRunner,
    target_bundle: ModelBundle,
    target_id: str,
    target: ResolvedModel | None = None,
    progress: Callable[[str], None] | None = None,
) -> Proposer | None:
    """The EAGLE-3 head's proposer, or None unless --speculative eagle. The head: --draft-model (a folder),
    else the target's models.yaml `eagle` (a repo or alias, pulled here if `localchat pull` has not)."""
    if settings.speculative != "eagle" or settings.backend == "fake":
        return None
    head = settings.draft_model
    if not head and (named := draft_model_name(settings, target, "eagle")):
        head = str(_resolve(named, progress).path)
    return eagle_proposer_for(head, runner, target_bundle, target_id)


def eagle_proposer_for(
    head: str | None, runner: ModelRunner, target_bundle: ModelBundle, target_id: str
) -> Proposer:
    """Attach the EAGLE-3 head in folder `head` to the target's runner. Typed errors: no head named, a
    runner that cannot feed one, a head trained for another target (Eagle3LoadError)."""
    if not head:
        raise SettingsError(
            "--speculative eagle needs an EAGLE-3 head: pass --draft-model FOLDER (the head's config.json "
            "and .safetensors, e.g. a vLLM / SpecForge / speculators export for this target), or use "
            "--speculative draft or ngram.",
            param="draft_model",
        )
    attach = getattr(runner, "eagle3_proposer", None)
    if attach is None:
        raise SettingsError(
            f"--speculative eagle runs on the torch backend only: the {type(runner).__name__} runner "
            "cannot hand an EAGLE-3 head the target's hidden states. Use --speculative draft or ngram.",
            param="speculative",
        )
    proposer: Proposer = attach(str(Path(head).expanduser()), target_id, target_bundle.config.vocab_size)
    log.info("EAGLE-3 head %s attached to %s", head, target_id)
    return proposer
