"""A Gemma 3 vision checkpoint (Gemma3ForConditionalGeneration safetensors folder) written as llama.cpp
publishes it: the text GGUF and the separate `mmproj-*.gguf` projector, both by llama.cpp's own converter
(`--mmproj` for the projector). The converter reads the transformers 4.5x tensor names and needs the
projector's image_seq_length, so it gets a copy of the folder with those; and since our tiny test
tokenizer is word-level (no pre-tokenizer llama.cpp knows by hash), the text conversion is told its
pre-tokenizer is "whitespace" (split at spaces, no byte-level mapping) instead of failing the hash lookup."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.helpers.llama_convert import ensure_converter

_RENAMES = (("model.vision_tower.", "vision_tower.vision_model."),
            ("vision_tower.", "vision_tower.vision_model."),
            ("model.multi_modal_projector.", "multi_modal_projector."))  # fmt: skip

_TEXT_CONVERT = """
import runpy, sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "whitespace"
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _converter_input(folder: Path, work: Path, tokens_per_image: int) -> Path:
    copy = work / "convert-input"
    shutil.copytree(folder, copy)
    for path in copy.glob("*.safetensors"):
        state = load_file(path)
        renamed = {}
        for key, value in state.items():
            for old, new in _RENAMES:
                if key.startswith(old):
                    key = new + key[len(old) :]
                    break
            renamed[key] = value
        save_file(renamed, path, metadata={"format": "pt"})
    pre = copy / "preprocessor_config.json"
    config = (
        json.loads(pre.read_text()) if pre.exists() else {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    )
    pre.write_text(json.dumps({**config, "image_seq_length": tokens_per_image}))
    tok = copy / "tokenizer_config.json"
    tok_config = json.loads(tok.read_text()) if tok.exists() else {}
    # the plain fast tokenizer: transformers' Gemma class would add tokens the tiny vocabulary lacks
    tok.write_text(json.dumps({**tok_config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return copy


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def write_gguf_pair(folder: Path, out: Path, tokens_per_image: int) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF), f32 (the converter keeps the projector matrix in f16), in `out`."""
    root = ensure_converter()
    out.mkdir(parents=True, exist_ok=True)
    source = _converter_input(folder, out.parent / f"{out.name}-work", tokens_per_image)
    model, mmproj = out / "tiny-gemma3-f32.gguf", out / "mmproj-tiny-gemma3-f32.gguf"
    _run(
        [
            sys.executable,
            "-c",
            _TEXT_CONVERT,
            str(root),
            str(source),
            "--outfile",
            str(model),
            "--outtype",
            "f32",
        ]
    )
    script = str(root / "convert_hf_to_gguf.py")
    _run([sys.executable, script, str(source), "--outfile", str(mmproj), "--outtype", "f32", "--mmproj"])
    shutil.rmtree(source.parent)
    return model, mmproj
