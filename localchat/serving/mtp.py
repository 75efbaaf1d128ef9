"""`--speculative mtp` (and `auto` on a model that ships the head): the checkpoint's own multi-token-
prediction head, attached to the target's runner (backends/torch/mtp_proposer.py runs it on torch,
backends/mlx/mtp_proposer.py on MLX: Qwen3.5 / Qwen3-Next there).

The head's tensors (a folder's `mtp.*`, a GGUF's extra `nextn` block) are read again from the model's
files after the target's load released its weight source: the target's load skips them, so a server
that does not speculate with them never holds them. The RAM estimate (models/memory.py) already counts
them: it sizes every tensor of the files.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from localchat.config import SettingsError
from localchat.errors import LocalchatError, ModelLoadError
from localchat.weights.loader import load_model
from localchat.weights.safetensors import safetensors_files

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.engine.interface import ModelRunner
    from localchat.engine.speculative import Proposer
    from localchat.weights.bundle import ModelBundle

log = logging.getLogger("localchat")

MTP_PREFIXES = ("mtp.", "model.mtp.")  # as stored: Qwen3-Next's at the top, some exports under model.


def has_mtp_head(bundle: ModelBundle) -> bool:
    """Whether the model's files carry a multi-token-prediction head: a safetensors folder's `mtp.*`
    tensors (only the headers are read), a GGUF's extra `nextn` blocks (llama.cpp's converter writes
    them unless given --no-mtp; counted in the metadata)."""
    if bundle.format == "gguf":
        return int(bundle.config.extra.get("gguf_mtp_layers") or 0) > 0
    if bundle.format != "safetensors" or not bundle.path.is_dir():
        return False
    try:
        files = safetensors_files(bundle.path, quantized=True)
    except ModelLoadError:
        return False
    # GLM-4.5: nextn layers after the model's own, each with an eh_proj (arch/nextn.py)
    return any(name.startswith(MTP_PREFIXES) or ".eh_proj." in name for f in files for name in f.header)


def mtp_proposer_for(runner: ModelRunner, bundle: ModelBundle, target_id: str) -> Proposer:
    """Attach the head of `bundle`'s checkpoint to `runner`. Typed errors: a backend without the head's
    code, a model without a head (MtpLoadError from the backend's side)."""
    attach = getattr(runner, "mtp_proposer", None)
    if attach is None:
        raise SettingsError(
            f"--speculative mtp runs on the torch and MLX backends only: the {type(runner).__name__} runner "
            "cannot run the model's multi-token-prediction head. Use --speculative ngram or draft.",
            param="speculative",
        )
    if bundle.format not in ("safetensors", "gguf") or not bundle.path.exists():
        raise ModelLoadError(f"--speculative mtp: {target_id} has no model files to read the head from")
    weights = load_model(bundle.path).iter_weights()  # memory-mapped: only the head's tensors are read
    proposer: Proposer = attach(weights, target_id, bundle.config.vocab_size)
    log.info("multi-token-prediction head of %s attached", target_id)
    return proposer


def load_mtp_proposer(
    settings: Settings, runner: ModelRunner, bundle: ModelBundle, target_id: str
) -> Proposer | None:
    """`mtp_for_method` for the server's --speculative."""
    if settings.backend == "fake":
        return None
    return mtp_for_method(settings.speculative, runner, bundle, target_id)


def mtp_for_method(method: str, runner: ModelRunner, bundle: ModelBundle, target_id: str) -> Proposer | None:
    """The MTP proposer for `mtp` (errors are the load's), or for `auto` when the files carry a head (a
    head that cannot be attached then only logs: auto falls back to its other choices); else None."""
    if method not in ("mtp", "auto"):
        return None
    if method == "auto" and not has_mtp_head(bundle):
        return None
    try:
        return mtp_proposer_for(runner, bundle, target_id)
    except LocalchatError as exc:
        if method == "mtp":
            raise
        log.warning("--speculative auto: the model's multi-token-prediction head is not used: %s", exc)
        return None
