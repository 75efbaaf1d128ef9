"""The seven torch backend tuning variables live in config.py's one table: read from the environment
when the backend asks, refused with the accepted values when wrong, and listed by `--help`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localchat.cli.main import build_parser
from localchat.config import BACKEND_VARIABLES, backend_variable
from localchat.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parents[2] / "localchat"
NAMES = [v.env for v in BACKEND_VARIABLES]


def test_the_table_names_the_seven_variables():
    assert sorted(NAMES) == sorted(
        "LOCALCHAT_" + n
        for n in (
            "KERNELS",
            "KERNEL_LAYOUT",
            "KERNEL_ACTIVATIONS",
            "TORCH_QUANT",
            "DECODE_STEP",
            "TORCH_ATTENTION",
            "CUDA_INT4",
        )
    )


@pytest.mark.parametrize("var", BACKEND_VARIABLES, ids=NAMES)
def test_unset_or_empty_is_the_default_and_case_and_spaces_do_not_matter(var):
    assert backend_variable(var.env, {}) == var.default
    assert backend_variable(var.env, {var.env: "  "}) == var.default
    other = var.choices[-1] if var.choices else "off"
    assert backend_variable(var.env, {var.env: f" {other.upper()} "}) == other


@pytest.mark.parametrize("var", [v for v in BACKEND_VARIABLES if v.choices], ids=lambda v: v.env)
def test_a_wrong_value_names_the_variable_and_what_it_accepts(var):
    with pytest.raises(BackendUnavailableError, match=re.escape(f"{var.env}='nope'")) as err:
        backend_variable(var.env, {var.env: "nope"})
    assert ", ".join(var.choices) in err.value.message


def test_the_process_environment_is_read_each_time(monkeypatch):
    monkeypatch.setenv("LOCALCHAT_DECODE_STEP", "layers")
    assert backend_variable("LOCALCHAT_DECODE_STEP") == "layers"
    monkeypatch.setenv("LOCALCHAT_DECODE_STEP", "fused")
    assert backend_variable("LOCALCHAT_DECODE_STEP") == "fused"


def test_help_lists_every_variable():
    text = build_parser().format_help()
    assert all(name in text for name in NAMES)


def test_no_module_reads_them_from_the_environment_itself():
    pattern = re.compile(r"environ(\.get)?[(\[]\s*\"(" + "|".join(NAMES) + r")\"")
    offenders = [str(p) for p in ROOT.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
