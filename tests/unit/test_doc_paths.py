"""Every repository path the docs name exists, so docs/, README.md, DEVELOPERS.md and CHANGELOG.md
follow the code when files move. A path is a word that starts with a top-level folder of the checkout
(`localchat/...`, `tests/...`, `csrc/...`, `benchmarks/...`); docs/architecture.md also names files
relative to `localchat/` (`engine/engine.py`, `backends/torch/...`). Globs (`test_tp*.py`) and brace
lists (`{a,b}.py`) match at least one file; a module may be named without `.py`."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "localchat"
TOP_LEVEL = ("localchat", "tests", "csrc", "benchmarks", "installers", "docs", ".ci")
# docs/architecture.md names files inside the package from its subpackages down.
RELATIVE_TO_PACKAGE = {"docs/architecture.md"}
DOCS = [
    "README.md",
    "DEVELOPERS.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
]

# A path-like word: not preceded by a path character (so `a/b/c` is read once, from its start).
PATH_WORD = re.compile(r"(?<![\w./{-])((?:\.ci|[A-Za-z_]\w*)/[\w./*{},-]*)")


def package_dirs() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def expand_braces(word: str) -> list[str]:
    """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`] (any number of brace lists, not nested)."""
    parts = re.split(r"\{([^{}]*)\}", word)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def exists(path: str) -> bool:
    """A file or folder (globs allowed), or a module named without its `.py`."""
    return any(
        any(ROOT.glob(candidate)) if "*" in candidate else (ROOT / candidate).exists()
        for candidate in (path, path + ".py")
    )


def named_paths(doc: str) -> list[tuple[int, str, list[str]]]:
    """(line, word, the repo paths it may mean) for each path-like word of `doc`."""
    subpackages = package_dirs() if doc in RELATIVE_TO_PACKAGE else set()
    found = []
    for number, line in enumerate((ROOT / doc).read_text(encoding="utf-8").splitlines(), 1):
        for match in PATH_WORD.finditer(line):
            word = match.group(1).rstrip(".,/")
            first = word.split("/")[0]
            if first in TOP_LEVEL:
                found.append((number, word, [word]))
            elif first in subpackages:
                found.append((number, word, [word, f"localchat/{word}"]))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc: str) -> None:
    missing = [
        f"{doc}:{number}: {word}"
        for number, word, meanings in named_paths(doc)
        if not any(all(exists(p) for p in expand_braces(m)) for m in meanings)
    ]
    assert missing == [], "these paths do not exist (moved? fix the doc):\n" + "\n".join(missing)


def test_the_checker_reads_paths_and_catches_a_missing_one(tmp_path: Path) -> None:
    assert expand_braces("a/{b,c}/d{1,2}.py") == ["a/b/d1.py", "a/b/d2.py", "a/c/d1.py", "a/c/d2.py"]
    assert exists("localchat/engine/engine.py") and exists("localchat/engine/engine")
    assert exists("tests/unit/test_doc_*.py")
    assert not exists("localchat/engine/no_such_module.py")
    words = [m.group(1) for m in PATH_WORD.finditer("see `localchat/server/app.py`, not x/localchat/y")]
    assert words == ["localchat/server/app.py", "x/localchat/y"]
