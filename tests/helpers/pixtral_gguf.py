"""The tiny random Mistral3ForConditionalGeneration (tests/helpers/pixtral_models.py) written as llama.cpp
publishes Mistral Small 3.x: the text GGUF (`mistral3` architecture) and the `pixtral` mmproj GGUF, both
by llama.cpp's own convert_hf_to_gguf.py (the second with --mmproj), f32, side by side so the loader
pairs them. The word-level test tokenizer is told it is "whitespace" (as the Qwen-VL GGUF helper does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.llama_convert import ensure_converter
from tests.helpers.qwen_vl_gguf import _TEXT_CONVERT


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def write_gguf_pair(folder: Path, out: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF) of the safetensors folder, in `out`."""
    root = ensure_converter()
    out.mkdir(parents=True, exist_ok=True)
    model, mmproj = out / "tiny-mistral3-f32.gguf", out / "mmproj-tiny-mistral3-f32.gguf"
    _run([sys.executable, "-c", _TEXT_CONVERT, str(root), str(folder), "--outfile", str(model),
          "--outtype", "f32"])  # fmt: skip
    script = str(root / "convert_hf_to_gguf.py")
    _run([sys.executable, script, str(folder), "--outfile", str(mmproj), "--outtype", "f32", "--mmproj"])
    return model, mmproj
