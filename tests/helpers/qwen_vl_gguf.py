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

KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_vl_moe")
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
    hf = _build_qwen3_vl_moe() if kind == "qwen3_vl_moe" else tiny.build(kind)
    if kind == "qwen2_5_vl":
        hf.config.vision_config.window_size = 112
        hf.model.visual.window_size = 112
    hf.save_pretrained(folder)
    if kind == "qwen3_vl_moe":
        _hub_expert_layout(folder)
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": tiny.TEMPLATE, **special}))
    tiny.image_processor(kind).save_pretrained(folder)
    return hf


def _build_qwen3_vl_moe() -> Any:
    """Qwen3-VL-MoE: the tiny Qwen3-VL with 4 experts (2 per token) in every layer, initialised alike."""
    import torch
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    torch.manual_seed(0)
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True, "rope_theta": 1e4}
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48}
    text = {**tiny.TEXT, **moe, "head_dim": 16, "rope_parameters": rope}
    vision = {
        **tiny.VISION,
        "patch_size": 16,
        "num_position_embeddings": 36,
        "deepstack_visual_indexes": [0, 2],
    }
    ids: dict[str, Any] = {"image_token_id": tiny.IMAGE, "video_token_id": tiny.VIDEO}
    ids |= {"vision_start_token_id": tiny.START, "vision_end_token_id": tiny.END}
    hf = Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig(text_config=text, vision_config=vision, **ids))
    with torch.no_grad():  # as tiny.build: weights large enough that the picture moves the logits
        for name, param in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_q.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    return hf.eval()


def _hub_expert_layout(folder: Path) -> None:
    """transformers 5 saves packed experts as it holds them ([E, out, in]); the hub's Qwen3-VL-MoE files (and
    llama.cpp's converter) have them [E, in, out]."""
    from safetensors.torch import load_file, save_file

    for path in folder.glob("*.safetensors"):
        state = load_file(path)
        for name in [n for n in state if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
            state[name] = state[name].transpose(1, 2).contiguous()
        save_file(state, path, metadata={"format": "pt"})


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


def write_mmproj(folder: Path, out: Path, outtype: str) -> Path:
    """The mmproj alone, in `outtype` (q8_0: as the quantized mmproj files some repos publish)."""
    script = str(ensure_converter() / "convert_hf_to_gguf.py")
    _run([sys.executable, script, str(folder), "--outfile", str(out), "--outtype", outtype, "--mmproj"])
    return out


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
