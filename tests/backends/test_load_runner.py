"""`load_runner`: once the runner holds its own weights, the model file is unmapped and the bundle
cannot feed another runner by accident (that would need the file again)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from localchat import LLM, SamplingParams
from localchat.errors import ModelLoadError

pytestmark = pytest.mark.slow


def _mapped(path: Path) -> bool:
    return str(path) in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_model_file_is_released_after_load(smollm2_gguf: Path, tmp_path: Path, backend: str) -> None:
    pytest.importorskip("mlx.core" if backend == "mlx" else "torch")
    # A private copy: other tests in this process may map the shared file.
    path = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_gguf, path)
    llm = LLM(path, backend=backend)
    assert not _mapped(path.resolve()), "the GGUF is still mapped after the runner loaded it"
    with pytest.raises(ModelLoadError, match="load the model again"):
        next(iter(llm.model.iter_weights()))
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))
    assert "Paris" in out[0].text  # the runner's own weights are intact
