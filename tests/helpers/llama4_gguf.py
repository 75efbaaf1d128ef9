"""The tiny random Llama4ForConditionalGeneration (tests/helpers/llama4_vision_models.py) written as llama.cpp
publishes Llama 4: the text GGUF (`llama4` architecture) and the `llama4` mmproj GGUF, both by llama.cpp's
own convert_hf_to_gguf.py (the second with --mmproj), f32, side by side so the loader pairs them.
The tower gets 3 layers, not 2: the converter maps the adapter's fc1/fc2 through the tower's block
numbers, so fc2 needs at least 3 blocks (Llama 4 Scout has 34). The text model takes Scout's attention
temperature tuning (floor 8192, scale 0.1): a llama4 GGUF does not record it and llama.cpp fixes those."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from transformers import Llama4Config, Llama4ForConditionalGeneration

from tests.helpers import llama4_vision_models as tiny
from tests.helpers.llama_convert import ensure_converter
from tests.helpers.qwen_vl_gguf import _TEXT_CONVERT

VISION = {**tiny.VISION, "num_hidden_layers": 3}
TEXT = {**tiny.TEXT, "floor_scale": 8192, "attn_scale": 0.1}


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def write_folder(folder: Path) -> Llama4ForConditionalGeneration:
    """The tiny safetensors folder (tokenizer, template, preprocessor config) with the 3-layer tower."""
    tiny.write_folder(folder)
    torch.manual_seed(0)
    config = Llama4Config(text_config=TEXT, vision_config=VISION, image_token_index=tiny.PATCH_ID)
    hf = Llama4ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            norm = "norm" in name and name.endswith("weight")
            param.copy_((1.0 if norm else 0.0) + (0.2 if norm else 0.15) * torch.randn_like(param))
    hf.save_pretrained(folder)
    return hf.eval()


def write_gguf_pair(folder: Path, out: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF) of the safetensors folder, in `out`."""
    root = ensure_converter()
    out.mkdir(parents=True, exist_ok=True)
    model, mmproj = out / "tiny-llama4-f32.gguf", out / "mmproj-tiny-llama4-f32.gguf"
    _run([sys.executable, "-c", _TEXT_CONVERT, str(root), str(folder), "--outfile", str(model),
          "--outtype", "f32"])  # fmt: skip
    script = str(root / "convert_hf_to_gguf.py")
    _run([sys.executable, script, str(folder), "--outfile", str(mmproj), "--outtype", "f32", "--mmproj"])
    return model, mmproj
