"""The `localchat` command line: flags, LOCALCHAT_* variables, commands, the security warning."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localchat import __version__
from localchat.cli import main as cli
from localchat.config import SETTINGS_SPEC, Settings, SettingsError
from localchat.server.runtime import security_warning
from tests.helpers.live_server import REPO, free_port


def test_every_setting_has_a_flag_and_an_env_var():
    names = {s.name for s in SETTINGS_SPEC}
    assert names == set(Settings.__dataclass_fields__)
    for spec in SETTINGS_SPEC:
        assert spec.flags and all(f.startswith("--") for f in spec.flags)
        assert spec.env == "LOCALCHAT_" + spec.name.upper()


def test_candle_vllm_short_and_long_flags():
    for short, long_, name, value in [
        ("--w", "--weights", "weights", "/m"),
        ("--f", "--file", "file", "a.gguf"),
        ("--m", "--model", "model", "smollm2-135m"),
        ("--p", "--port", "port", "9001"),
    ]:
        for flag in (short, long_):
            _, _, settings = cli.parse_settings(["serve", flag, value], environ={})
            assert str(getattr(settings, name)) == value


def test_all_engine_and_sampling_flags_parse():
    argv = [
        "serve",
        "--host",
        "0.0.0.0",
        "--api-key",
        "k",
        "--cors-origin",
        "http://a",
        "--cors-origin",
        "http://b",
        "--log",
        "debug",
        "--dtype",
        "bfloat16",
        "--mem",
        "64",
        "--max-num-seqs",
        "4",
        "--max-model-len",
        "2048",
        "--prefill-chunk-size",
        "0",
        "--max-gen-tokens",
        "100",
        "--temperature",
        "0.5",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--min-p",
        "0.05",
        "--frequency-penalty",
        "0.1",
        "--presence-penalty",
        "0.2",
        "--backend",
        "fake",
        "--device",
        "cpu",
        "--no-ui",
        "--threads",
        "1",
    ]
    _, _, s = cli.parse_settings(argv, environ={})
    assert (s.host, s.api_key, s.cors_origins, s.log, s.dtype) == (
        "0.0.0.0",
        "k",
        ["http://a", "http://b"],
        "debug",
        "bfloat16",
    )
    config = s.engine_config()
    assert (config.kv_cache_mib, config.max_num_seqs, config.max_model_len, config.prefill_chunk_size) == (
        64,
        4,
        2048,
        0,
    )
    assert s.sampling_defaults == {
        "temperature": 0.5,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.05,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
    }
    assert (s.max_gen_tokens, s.backend, s.device, s.ui, s.threads) == (100, "fake", "cpu", False, 1)


def test_env_vars_and_precedence():
    env = {
        "LOCALCHAT_PORT": "9100",
        "LOCALCHAT_CORS_ORIGINS": "http://a, http://b",
        "LOCALCHAT_UI": "0",
        "LOCALCHAT_TEMPERATURE": "0.3",
        "LOCALCHAT_MEM": "32",
        "LOCALCHAT_PREFIX_CACHE": "false",
    }
    _, _, s = cli.parse_settings(["serve"], environ=env)
    assert (s.port, s.cors_origins, s.ui, s.temperature, s.kv_cache_mib, s.enable_prefix_caching) == (
        9100,
        ["http://a", "http://b"],
        False,
        0.3,
        32,
        False,
    )
    _, _, s = cli.parse_settings(["serve", "--p", "9200"], environ=env)
    assert s.port == 9200  # the command line wins


def test_flags_before_or_after_the_command():
    assert cli.parse_settings(["--p", "9300", "serve"], environ={})[2].port == 9300
    assert cli.parse_settings(["serve", "--p", "9301"], environ={})[2].port == 9301
    command, ui_server, s = cli.parse_settings(["--ui-server", "--no-browser"], environ={})
    assert (command, ui_server, s.open_browser) == (None, True, False)


@pytest.mark.parametrize(
    ("env", "flag"),
    [
        ({"LOCALCHAT_PORT": "eighty"}, None),
        ({"LOCALCHAT_UI": "maybe"}, None),
        ({"LOCALCHAT_BACKEND": "cuda"}, None),
        ({}, ["--p", "70000"]),
        ({}, ["--f", "a.gguf", "--m", "smollm2-135m"]),
    ],
)
def test_invalid_settings_are_clear_errors(env, flag):
    with pytest.raises(SettingsError) as info:
        cli.parse_settings(["serve", *(flag or [])], environ=env)
    assert info.value.message


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--temperature", "-3"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-k", "-5"], "--top-k"),
        (["--min-p", "1.5"], "--min-p"),
        (["--repetition-penalty", "0"], "--repetition-penalty"),
    ],
)
def test_invalid_default_sampling_is_refused_at_startup(args, flag):
    """Not at the first request that leaves the field out, with an error naming a field it never sent."""
    with pytest.raises(SettingsError) as info:
        cli.parse_settings(["serve", *args], environ={})
    assert info.value.message.startswith(f"{flag}: ")
    with pytest.raises(SettingsError):
        cli.parse_settings(["serve"], environ={f"LOCALCHAT_{flag[2:].upper().replace('-', '_')}": args[1]})
    assert cli.parse_settings(["serve", "--temperature", "0.2", "--top-p", "0.9"], environ={})[2].top_p == 0.9


def test_main_exit_codes_and_messages(capsys, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(REPO / "test-output" / "home"))
    # a free port: the port is checked before the model (8000 may be taken on a shared machine)
    assert cli.main(["serve", "--p", str(free_port()), "--f", "/definitely/not/here.gguf"]) == 1
    assert "no such GGUF file" in capsys.readouterr().err
    assert cli.main(["serve", "--f", "a.gguf", "--w", "b"]) == 2
    assert "only one of" in capsys.readouterr().err


def test_bare_localchat_opens_the_desktop_app_and_ui_server_the_browser(monkeypatch):
    import localchat.desktop.app

    calls = []
    monkeypatch.setattr(cli, "_serve", lambda settings, open_browser: calls.append(open_browser) or 0)
    desktop = []
    monkeypatch.setattr(
        localchat.desktop.app,
        "run_desktop",
        lambda settings, selftest, fallback: desktop.append(selftest) or 0,
    )
    assert cli.main([]) == 0
    assert cli.main(["--selftest", "--backend", "fake"]) == 0
    assert desktop == [False, True]
    assert cli.main(["--ui-server"]) == 0
    assert cli.main(["--ui-server", "--no-browser"]) == 0
    assert calls == [True, False]


def test_ui_server_with_no_ui_is_refused(capsys):
    assert cli.main(["--ui-server", "--no-ui", "--backend", "fake"]) == 1
    assert "drop --no-ui" in capsys.readouterr().err


def test_python_dash_m_and_help():
    out = subprocess.run(
        [sys.executable, "-m", "localchat", "--version"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == f"localchat {__version__}"
    help_text = subprocess.run(
        [sys.executable, "-m", "localchat", "serve", "--help"], cwd=REPO, capture_output=True, text=True
    ).stdout
    for spec in SETTINGS_SPEC:
        assert spec.flags[-1] in help_text and spec.env in help_text


def test_loud_warning_when_exposed_without_a_key():
    assert security_warning(Settings(host="0.0.0.0")) is not None
    assert "NO API KEY" in security_warning(Settings(host="0.0.0.0"))
    assert security_warning(Settings(host="0.0.0.0", api_key="k")) is None
    assert security_warning(Settings()) is None and Settings().host == "127.0.0.1"


def test_allowed_hosts_from_flags_and_environment():
    _, _, settings = cli.parse_settings(
        ["serve", "--allowed-host", "a.lan", "--allowed-host", "b.lan"], environ={}
    )
    assert settings.allowed_hosts == ["a.lan", "b.lan"]
    _, _, settings = cli.parse_settings(["serve"], environ={"LOCALCHAT_ALLOWED_HOSTS": "a.lan, b.lan"})
    assert settings.allowed_hosts == ["a.lan", "b.lan"]


def test_a_context_below_256_tokens_is_refused():
    with pytest.raises(SettingsError, match="smallest that works is --max-model-len 256") as info:
        Settings.load({"max_model_len": 255}, environ={})
    assert info.value.param == "max_model_len"
    assert Settings.load({"max_model_len": 256}, environ={}).max_model_len == 256


@pytest.mark.parametrize("isq", ["q4", "q8_0", "q4_k"])
def test_isq_choices_parse_from_flag_and_environment(isq):
    assert cli.parse_settings(["serve", "--isq", isq], environ={})[2].isq == isq
    assert cli.parse_settings(["serve"], environ={"LOCALCHAT_ISQ": isq})[2].isq == isq


def test_an_unknown_isq_type_is_refused_naming_the_choices():
    with pytest.raises(SettingsError, match="--isq must be one of q4, q8_0, q4_k, q4_0, got 'q2_k'"):
        Settings.load({"isq": "q2_k"}, environ={})


def test_engine_named_settings_keep_their_old_flags_and_variables():
    """kv_cache_mib and enable_prefix_caching are named like the EngineConfig fields they set; the older
    --mem / --no-prefix-cache and LOCALCHAT_MEM / LOCALCHAT_PREFIX_CACHE still work (users' scripts)."""
    for argv in (
        ["--kv-cache-mib", "48", "--no-enable-prefix-caching"],
        ["--mem", "48", "--no-prefix-cache"],
    ):
        _, _, s = cli.parse_settings(["serve", *argv], environ={})
        assert (s.kv_cache_mib, s.enable_prefix_caching) == (48, False)
        assert (s.engine_config().kv_cache_mib, s.engine_config().enable_prefix_caching) == (48, False)
    for env in (
        {"LOCALCHAT_KV_CACHE_MIB": "24", "LOCALCHAT_ENABLE_PREFIX_CACHING": "0"},
        {"LOCALCHAT_MEM": "24", "LOCALCHAT_PREFIX_CACHE": "0"},
    ):
        _, _, s = cli.parse_settings(["serve"], environ=env)
        assert (s.kv_cache_mib, s.enable_prefix_caching) == (24, False)
    both = {"LOCALCHAT_KV_CACHE_MIB": "24", "LOCALCHAT_MEM": "99"}  # the engine's name wins
    assert cli.parse_settings(["serve"], environ=both)[2].kv_cache_mib == 24
    with pytest.raises(SettingsError, match="LOCALCHAT_MEM='lots' is not valid"):
        cli.parse_settings(["serve"], environ={"LOCALCHAT_MEM": "lots"})
