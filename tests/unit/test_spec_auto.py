"""`--speculative auto` (engine/speculative_auto.py): the method picked per model size and device, the
parameter estimate on real model shapes, the pick reaching the engine through engine_for (stats, the
log line), /metrics naming the method in use and who chose it, and the setting accepted by the CLI."""

from __future__ import annotations

import logging

import pytest

from localchat.engine.config import EngineConfig
from localchat.engine.speculative import SpeculativeConfig
from localchat.engine.speculative_auto import approx_parameters, choose_auto, resolve_auto
from localchat.weights.config import ModelConfig


def config(
    hidden: int, inter: int, layers: int, heads: int, kv: int, head_dim: int, vocab: int
) -> ModelConfig:
    return ModelConfig(
        model_type="llama",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        tie_word_embeddings=True,
    )


SMOLLM2_135M = config(576, 1536, 30, 9, 3, 64, 49152)
QWEN25_15B = config(1536, 8960, 28, 12, 2, 128, 151936)
QWEN25_05B = config(896, 4864, 24, 14, 2, 64, 151936)


def test_parameter_estimate_matches_the_published_sizes() -> None:
    assert approx_parameters(SMOLLM2_135M) == pytest.approx(134.5e6, rel=0.01)
    assert approx_parameters(QWEN25_15B) == pytest.approx(1.54e9, rel=0.02)  # biases left out
    assert approx_parameters(QWEN25_05B) == pytest.approx(0.494e9, rel=0.02)


def test_auto_picks_ngram_only_for_large_models_on_cpu() -> None:
    cpu = "cpu (bfloat16)"
    assert choose_auto(approx_parameters(QWEN25_15B), cpu)[0] == "ngram"
    assert choose_auto(approx_parameters(SMOLLM2_135M), cpu)[0] == "off"
    assert choose_auto(approx_parameters(QWEN25_05B), cpu)[0] == "off"
    method, why = choose_auto(approx_parameters(QWEN25_15B), "cuda:0 NVIDIA H200 (bfloat16)")
    assert method == "off" and "cuda:0" in why
    assert choose_auto(approx_parameters(QWEN25_15B), "mlx metal (bfloat16)")[0] == "off"
    assert choose_auto(approx_parameters(QWEN25_15B), "mlx cpu (float32)")[0] == "off"


def test_resolve_replaces_only_auto_and_logs_why(caplog: pytest.LogCaptureFixture) -> None:
    plain = EngineConfig(speculative=SpeculativeConfig("draft"))
    assert resolve_auto(plain, QWEN25_15B, "cpu") is plain
    with caplog.at_level(logging.INFO, logger="localchat.engine.speculative_auto"):
        picked = resolve_auto(EngineConfig(speculative=SpeculativeConfig("auto", 6)), QWEN25_15B, "cpu")
    assert picked.speculative.method == "ngram" and picked.speculative.num_tokens == 6
    assert "1.54B parameters on CPU" in picked.speculative.auto_reason
    assert "--speculative auto picked ngram" in caplog.text
    # An engine handed an unresolved auto (no engine_for) does not speculate.
    assert not SpeculativeConfig("auto").enabled


def test_auto_reaches_the_engine_and_metrics_through_engine_for() -> None:
    from localchat.serving.assembly import engine_for
    from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

    bundle = bundle_from_hf(tiny_hf_model("llama", vocab_size=259))
    spec = SpeculativeConfig("auto")
    engine = engine_for(
        bundle, fp32_runner(bundle), EngineConfig(kv_cache_mib=8, block_size=4, speculative=spec)
    )
    stats = engine.stats()
    assert stats.speculative_method == "off"  # a tiny model on CPU
    assert "parameters on CPU" in stats.speculative_auto_reason
    assert not engine.scheduler.speculate


def test_the_cli_accepts_auto() -> None:
    from localchat.config import Settings

    settings = Settings.load(environ={"LOCALCHAT_SPECULATIVE": "auto"})
    assert settings.engine_config().speculative.method == "auto"


def test_metrics_name_the_method_and_who_chose_it() -> None:
    from tests.helpers.fake_app import fake_client

    with fake_client(speculative="auto") as (client, _):
        text = client.get("/metrics").text
    assert 'localchat_speculative_method{method="off",chosen_by="auto"} 1' in text
    assert "localchat_spec_draft_length_avg 0" in text
