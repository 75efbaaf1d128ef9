"""The tiny random SmolVLMForConditionalGeneration (tests/helpers/smolvlm_models.py) written as llama.cpp
publishes SmolVLM: the text GGUF (`llama` architecture) and the `idefics3` mmproj GGUF, both by llama.cpp's
own convert_hf_to_gguf.py (the second with --mmproj), f32, side by side so the loader pairs them. The
text conversion routes on text_config.architectures = VLlama3ForCausalLM, as the hub's config.json has it;
the word-level test tokenizer is told it is "whitespace" (as the Qwen-VL GGUF helper does)."""

from __future__ import annotations

import json
import shutil
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
    source = out / "hf"
    shutil.copytree(folder, source)
    config = json.loads((source / "config.json").read_text())
    config["text_config"]["architectures"] = ["VLlama3ForCausalLM"]  # as on the hub
    (source / "config.json").write_text(json.dumps(config))
    model, mmproj = out / "tiny-smolvlm-f32.gguf", out / "mmproj-tiny-smolvlm-f32.gguf"
    _run([sys.executable, "-c", _TEXT_CONVERT, str(root), str(source), "--outfile", str(model),
          "--outtype", "f32"])  # fmt: skip
    script = str(root / "convert_hf_to_gguf.py")
    _run([sys.executable, script, str(source), "--outfile", str(mmproj), "--outtype", "f32", "--mmproj"])
    shutil.rmtree(source)
    return model, mmproj
