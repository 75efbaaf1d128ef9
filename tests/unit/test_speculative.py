"""The model-agnostic parts of speculative decoding: n-gram proposals, the acceptance rule, the
settings' validation, and the runners/models that turn it off with a reason."""

from __future__ import annotations

import pytest

from localchat.backends.fake import EOS_ID, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative import SpeculativeConfig, accept_drafts, pause_after, propose_ngram
from localchat.errors import InvalidRequestError
from tests.helpers.fake_engine import fake_engine
from tests.unit.test_hybrid_engine import StateRunner


def test_ngram_proposes_what_followed_the_latest_match() -> None:
    tokens = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3]
    # [1, 2, 3] occurred twice before: the latest occurrence (followed by 5, 6, 7) wins.
    assert propose_ngram(tokens, 3) == [5, 6, 7]
    assert propose_ngram(tokens, 10) == [5, 6, 7, 1, 2, 3]  # runs to the end of what is known
    assert propose_ngram([1, 2, 3, 4], 4) == []  # nothing repeats
    assert propose_ngram([7, 7], 4) == []  # shorter than a 2-gram plus one token
    assert propose_ngram(tokens, 0) == []
    # Longest suffix first: [8, 1] matches only at its own earlier spot, before [1]'s later ones.
    assert propose_ngram([8, 1, 5, 0, 1, 6, 8, 1], 1, ngram_min=1) == [5]


def test_acceptance_keeps_agreeing_drafts_then_the_target_token() -> None:
    assert accept_drafts([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all kept plus the bonus token
    assert accept_drafts([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # the first disagreement ends it
    assert accept_drafts([5], [4, 1]) == [4]
    assert accept_drafts([], [3]) == [3]


def test_misses_pause_proposals_longer_each_time_up_to_a_cap() -> None:
    assert [pause_after(n) for n in range(7)] == [0, 2, 4, 8, 16, 16, 16]


def test_settings_are_validated() -> None:
    with pytest.raises(InvalidRequestError, match="speculative must be one of"):
        SpeculativeConfig("medusa").validate()
    with pytest.raises(InvalidRequestError, match="num_speculative_tokens"):
        SpeculativeConfig("ngram", num_tokens=99).validate()
    assert not SpeculativeConfig("ngram", num_tokens=0).enabled
    assert not SpeculativeConfig().enabled  # off unless asked for


def test_hybrid_models_and_the_fake_runner_turn_speculation_off_with_a_reason() -> None:
    spec = SpeculativeConfig("ngram")
    hybrid = LLMEngine(
        StateRunner(),  # type: ignore[arg-type]
        FakeTokenizer(),
        EngineConfig(kv_cache_mib=1, speculative=spec),
        eos_token_ids=[EOS_ID],
        model_max_len=256,
    )
    assert "does not write the per-position recurrent states" in hybrid.speculation_note
    assert not hybrid.scheduler.speculate
    fake = fake_engine(speculative=spec)
    assert "FakeRunner runner cannot score draft tokens" in fake.speculation_note
    assert not fake.scheduler.speculate
    assert fake_engine().speculation_note == ""  # not asked for: nothing to say


def test_settings_reach_the_engine_config() -> None:
    from localchat.config import Settings, SettingsError

    settings = Settings.load(
        environ={"LOCALCHAT_SPECULATIVE": "ngram", "LOCALCHAT_NUM_SPECULATIVE_TOKENS": "6"}
    )
    assert settings.engine_config().speculative == SpeculativeConfig("ngram", 6)
    assert Settings.load(environ={}).engine_config().speculative == SpeculativeConfig()  # off by default
    with pytest.raises(SettingsError, match="--speculative must be one of off, ngram, draft, eagle"):
        Settings.load(environ={"LOCALCHAT_SPECULATIVE": "medusa"})
    eagle = Settings.load(environ={"LOCALCHAT_SPECULATIVE": "eagle", "LOCALCHAT_DRAFT_MODEL": "/heads/e3"})
    assert eagle.engine_config().speculative == SpeculativeConfig("eagle", 4)
    drafted = Settings.load(
        environ={"LOCALCHAT_SPECULATIVE": "draft", "LOCALCHAT_DRAFT_MODEL": "qwen2.5-0.5b"}
    )
    assert drafted.draft_model == "qwen2.5-0.5b"
    assert drafted.engine_config().speculative == SpeculativeConfig("draft", 4)
    with pytest.raises(SettingsError, match="num_speculative_tokens"):
        Settings.load(environ={"LOCALCHAT_SPECULATIVE": "ngram", "LOCALCHAT_NUM_SPECULATIVE_TOKENS": "99"})


def test_every_packaged_draft_names_a_smaller_entry_of_its_family() -> None:
    from localchat.models.catalog import load_catalog

    catalog = load_catalog()
    drafted = {alias: entry for alias, entry in catalog.items() if entry.draft}
    assert drafted  # the Qwen entries name theirs
    for alias, entry in drafted.items():
        draft = catalog[entry.draft]  # type: ignore[index]
        assert draft.architecture == entry.architecture, alias
        assert draft.size_gb is not None and entry.size_gb is not None
        assert draft.size_gb < entry.size_gb / 2, alias
