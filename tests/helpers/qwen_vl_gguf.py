"""Tiny random Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoints written as llama.cpp publishes them: the text
GGUF (`qwen2vl` / `qwen3vl` architecture) and the mmproj GGUF, both by llama.cpp's own
convert_hf_to_gguf.py (the second with --mmproj). The word-level test tokenizer has no pre-tokenizer
llama.cpp knows by hash, so the text conversion is told it is "whitespace" (as the Gemma 3 GGUF helper
does). Qwen2.5-VL's window is 112 px here: llama.cpp does not record it and always uses 112."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from tests.helpers import qwen_vl_models as tiny
from tests.helpers.llama_convert import ensure_converter

KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
_TEXT_CONVERT = """
import runpy, sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "whitespace"
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def write_folder(kind: str, folder: Path) -> Any:
    """The safetensors folder (tests/helpers/qwen_vl_models.py) with Qwen2.5-VL's window at llama.cpp's."""
    hf = tiny.build(kind)
    if kind == "qwen2_5_vl":
        hf.config.vision_config.window_size = 112
        hf.model.visual.window_size = 112
    hf.save_pretrained(folder)
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": tiny.TEMPLATE, **special}))
    tiny.image_processor(kind).save_pretrained(folder)
    return hf


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def write_gguf_pair(folder: Path, out: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF), f32, side by side in `out` (so the loader pairs them)."""
    root = ensure_converter()
    out.mkdir(parents=True, exist_ok=True)
    model, mmproj = out / "tiny-qwen-vl-f32.gguf", out / "mmproj-tiny-qwen-vl-f32.gguf"
    kind = json.loads((folder / "config.json").read_text())["model_type"]
    no_mtp = ["--no-mtp"] if kind.startswith("qwen3_5") else []  # the tiny Qwen3.5 has no MTP head
    _run([sys.executable, "-c", _TEXT_CONVERT, str(root), str(folder), "--outfile", str(model),
          "--outtype", "f32", *no_mtp])  # fmt: skip
    script = str(root / "convert_hf_to_gguf.py")
    _run([sys.executable, script, str(folder), "--outfile", str(mmproj), "--outtype", "f32", "--mmproj"])
    return model, mmproj


def reference_processor(kind: str, min_pixels: int, max_pixels: int) -> Qwen2VLImageProcessorPil:
    """transformers' processor set up as the GGUF pair's preprocessing (llama.cpp's pixel bounds)."""
    mean = None if kind in ("qwen2_vl", "qwen2_5_vl") else [0.5, 0.5, 0.5]
    extra = {} if mean is None else {"image_mean": mean, "image_std": mean}
    return Qwen2VLImageProcessorPil(
        patch_size=tiny.patch_size(kind),
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        **extra,
    )


def pictures(folder: Path) -> list[Path]:
    """A PNG and a JPEG larger than 112 px (several Qwen2.5-VL windows each) of different sizes."""
    rng = np.random.default_rng(3)
    paths = []
    for i, (shape, fmt) in enumerate((((150, 260, 3), "png"), ((200, 120, 3), "jpeg"))):
        path = folder / f"big{i}.{fmt}"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "RGB").save(path)
        paths.append(path)
    return paths
