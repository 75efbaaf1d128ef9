"""llama.cpp's vocabulary-only GGUF files with their test vectors (models/ggml-vocab-*.gguf, .inp, .out),
taken once from the llama-cpp-python source distribution on PyPI (it vendors llama.cpp) and cached in
the checkout's .models/llama.cpp-vocab/."""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The same release tests/helpers/llama_convert.py uses; pinned so the vectors cannot change under us.
SDIST_URL = (
    "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
    "llama_cpp_python-0.3.36.tar.gz"
)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_MARK = "/vendor/llama.cpp/models/ggml-vocab-"
SEPARATOR = "\n__ggml_vocab_test__\n"


def ensure_vocabs(directory: Path = REPO / ".models") -> Path:
    """The folder holding the ggml-vocab-* files; skips the test when PyPI cannot be reached."""
    target = directory / "llama.cpp-vocab"
    if (target / "ggml-vocab-llama-bpe.gguf").is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        sdist = Path(tmp) / "sdist.tar.gz"
        try:
            with urllib.request.urlopen(SDIST_URL, timeout=60) as answer, sdist.open("wb") as out:
                digest = hashlib.sha256()
                while chunk := answer.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as exc:
            pytest.skip(
                f"cannot download llama-cpp-python's sdist from PyPI ({exc}): no llama.cpp test vectors"
            )
        assert digest.hexdigest() == SDIST_SHA256, "llama-cpp-python 0.3.36 sdist changed on PyPI"
        unpacked = Path(tmp) / "vocab"
        unpacked.mkdir()
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                _, found, rest = member.name.partition(_MARK)
                if found and member.isfile() and "/" not in rest:
                    member.name = "ggml-vocab-" + rest
                    archive.extract(member, unpacked, filter="data")
        if not target.exists():
            os.replace(unpacked, target)  # atomic: a half-extracted folder is never seen
    return target


def read_vectors(vocab: Path) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs, split the way llama.cpp's test-tokenizer-0 splits them."""
    raw = Path(f"{vocab}.inp").read_text(encoding="utf-8")
    texts = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        texts = raw[: -len(SEPARATOR)].split(SEPARATOR)
    outs = Path(f"{vocab}.out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(outs), vocab
    return [(text, [int(i) for i in out.split()]) for text, out in zip(texts, outs, strict=True)]
