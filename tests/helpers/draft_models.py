"""Tiny target / draft pairs for the draft-model speculative decoding tests: a noisy copy of a tiny
random target as the draft, and an engine that speculates with it (or not, for the reference run)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from localchat.backends.fake import EOS_ID, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from tests.backends.test_speculative_torch import MODEL_VOCAB
from tests.helpers.torch_models import bundle_from_hf, fp32_runner


def noisy_draft(target_hf: torch.nn.Module, seed: int = 1, name: str = "tiny-draft") -> ModelBundle:
    """The target with a little noise (drawn from `seed`) on every weight: its greedy token agrees with
    the target's about a third of the time (tiny random models are chaotic: more noise and they hardly
    ever agree)."""
    draft: Any = copy.deepcopy(target_hf)
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.01 * torch.randn_like(param))
    return bundle_from_hf(draft, name)


def draft_engine(
    target: ModelBundle,
    draft: ModelBundle | None,
    max_batch: int = 4,
    k: int = 4,
    p_min: float = 0.0,
    kv_cache_mib: int = 16,
    seed: int | None = None,
    **config: object,
) -> LLMEngine:
    """An engine on `target` drafting with `draft` (None: speculation off, the reference run).
    p_min 0 by default: tiny random models spread their mass, so almost no guess would pass 0.75.
    `seed`: torch's global seed, the target's sampling generator and the draft's rng all set to it, so
    unseeded sampled requests draw the same tokens run to run."""
    spec = SpeculativeConfig(
        "draft" if draft else "off", num_tokens=k, max_batch=max_batch, draft_p_min=p_min
    )
    cfg = EngineConfig(kv_cache_mib=kv_cache_mib, block_size=4, speculative=spec, **config)  # type: ignore[arg-type]
    if seed is not None:
        torch.manual_seed(seed)
    runner = fp32_runner(target)
    if seed is not None:
        runner.generator.manual_seed(seed)
    engine = LLMEngine(
        runner,
        FakeTokenizer(),
        cfg,
        eos_token_ids=[EOS_ID],
        model_max_len=512,
        draft_runner=fp32_runner(draft) if draft else None,
        vocab_size=MODEL_VOCAB,
    )
    if seed is not None and engine.draft is not None:
        engine.draft.rng = np.random.default_rng(seed)
    return engine
