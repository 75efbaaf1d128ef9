"""The house rules that tools can check: ruff (lint + format), mypy on localchat/, no torch/mlx in it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the test extra")
def test_ruff_lint_and_format_are_clean() -> None:
    lint = run("ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = run("ruff", "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout[-3000:]


@pytest.mark.slow
def test_mypy_is_clean_on_localchat() -> None:
    pytest.importorskip("mypy")
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout[-3000:]


def test_localchat_never_imports_torch_or_mlx() -> None:
    """Only the backends (localchat/backends/, imported lazily by name) may import torch or mlx."""
    pattern = re.compile(r"^\s*(import|from)\s+(torch|mlx)\b", re.M)
    backends = REPO / "localchat" / "backends"
    offenders = [
        str(p)
        for p in (REPO / "localchat").rglob("*.py")
        if backends not in p.parents and pattern.search(p.read_text())
    ]
    assert offenders == []
    # The backend-neutral registry is imported by every backend; it must stay free of both too.
    assert all(not pattern.search(p.read_text()) for p in (REPO / "localchat" / "arch").rglob("*.py"))


def test_backend_modules_are_only_imported_lazily() -> None:
    """Core code reaches a backend through `localchat.backends.create_runner`, never a direct import."""
    pattern = re.compile(r"^\s*(import|from)\s+localchat\.backends\.(torch|mlx)\b", re.M)
    backends = REPO / "localchat" / "backends"
    offenders = [
        str(p)
        for p in (REPO / "localchat").rglob("*.py")
        if backends not in p.parents and pattern.search(p.read_text())
    ]
    assert offenders == []
