"""The README documents every CLI command, flag, setting/env var and API route (fails when one is missing)."""

from __future__ import annotations

import re

import pytest

from localchat.cli.main import COMMANDS
from localchat.config import SETTINGS_SPEC
from localchat.server.app import API_ROUTES
from tests.helpers.live_server import REPO

README = (REPO / "README.md").read_text()


def test_the_quick_start_stays_at_the_top():
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines() == [
        "pip install torch --index-url https://download.pytorch.org/whl/cpu   # first, on Linux/Windows without an NVIDIA GPU",
        "pip install . && localchat                         # install and run the app (offers the default model)",
        'pip install -e ".[test]" && python -m pytest       # the tests: about 25 minutes on 2 CPU cores',
    ]


def test_claims_a_new_user_checked():
    """Each was wrong once (issue 35): keep the words true."""
    # Nothing is on PyPI yet: no sentence may say releases are there, and no command may install them.
    assert "No release is on PyPI yet" in README
    assert "Releases are published on PyPI" not in README
    assert not re.search(r"pip install ['\"]?localchat-app", README)
    # The bare command offers the default model (a click in the window); it does not download it.
    assert "downloads the default model" not in README
    # The SDK example says how to get the SDK.
    sdk = README.split("### The openai SDK", 1)[1].split("###", 1)[0]
    assert "pip install openai" in sdk
    # /health can only say shutting_down on a connection that was open: new ones are refused.
    assert "`shutting_down` (during the drain" in README and "new connections are refused" in README


@pytest.mark.parametrize("flag", sorted({f for s in SETTINGS_SPEC for f in s.flags}))
def test_every_flag_is_documented(flag):
    assert f"`{flag}`" in README


@pytest.mark.parametrize("spec", SETTINGS_SPEC, ids=lambda s: s.name)
def test_every_setting_and_env_var_is_documented(spec):
    row = next((line for line in README.splitlines() if line.startswith(f"| `{spec.name}` |")), None)
    assert row is not None, f"no settings-table row for {spec.name}"
    assert f"`{spec.env}`" in row


@pytest.mark.parametrize("command", [*COMMANDS, "--ui-server"])
def test_every_command_is_documented(command):
    assert f"`localchat {command}`" in README


def _documented_routes() -> set[tuple[str, str]]:
    rows = re.findall(r"^\| (GET|POST|DELETE) \| `([^`]+)` \|", README, flags=re.M)
    return {(method, re.sub(r"\{[^}]*\}", "{}", path)) for method, path in rows}


@pytest.mark.parametrize("handler", API_ROUTES, ids=lambda h: h.name)
def test_every_route_is_documented(handler):
    documented = _documented_routes()
    for method in handler.http_methods:
        for path in handler.paths:
            normalized = re.sub(r"\{[^}]*\}", "{}", path)
            if not normalized.startswith("/v1") and ("/v1" + normalized in {p for m, p in documented}):
                assert "without the `/v1` prefix" in README
                continue
            assert (method, normalized) in documented, (
                f"{method} {path} is missing from the README's route table"
            )
