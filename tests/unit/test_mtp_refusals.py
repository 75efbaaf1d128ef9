"""`--speculative mtp` refusals that need no model: a runner without the head's code (the fake one, as
the tensor-parallel runners) is refused with a typed error naming the torch and MLX backends; `auto` picks the
head only when it was attached; a GGUF whose metadata counts no nextn block has no head."""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat.backends.fake import FakeRunner
from localchat.config import SettingsError
from localchat.engine.config import EngineConfig
from localchat.engine.speculative import SPECULATIVE_METHODS, SpeculativeConfig
from localchat.engine.speculative_auto import MTP_REASON, resolve_auto
from localchat.serving.mtp import has_mtp_head, mtp_for_method, mtp_proposer_for
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig


def bundle(fmt: str, **extra: object) -> ModelBundle:
    config = ModelConfig.from_hf_dict(
        {
            "model_type": "llama",
            "hidden_size": 64,
            "vocab_size": 256,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            **extra,
        }
    )
    return ModelBundle("m", Path("/nonexistent/m"), fmt, config, iter, tokenizer=None)  # type: ignore[arg-type]


def test_a_runner_without_the_head_code_is_refused() -> None:
    assert "mtp" in SPECULATIVE_METHODS
    with pytest.raises(SettingsError, match="torch and MLX backends only"):
        mtp_proposer_for(FakeRunner(), bundle("safetensors"), "m")
    with pytest.raises(SettingsError, match="torch and MLX backends only"):
        mtp_for_method("mtp", FakeRunner(), bundle("safetensors"), "m")


def test_auto_uses_the_head_only_when_attached() -> None:
    auto = EngineConfig(speculative=SpeculativeConfig("auto"))
    model = bundle("safetensors").config
    picked = resolve_auto(auto, model, "cpu", mtp_head=True).speculative
    assert (picked.method, picked.auto_reason) == ("mtp", MTP_REASON)
    assert resolve_auto(auto, model, "cpu").speculative.method != "mtp"
    # no files to read: no head, so auto attaches nothing and `ngram` / `off` stay its choices
    assert mtp_for_method("auto", FakeRunner(), bundle("safetensors"), "m") is None
    assert not has_mtp_head(bundle("gguf")) and not has_mtp_head(bundle("safetensors"))
