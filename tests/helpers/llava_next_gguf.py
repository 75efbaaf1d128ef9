"""A LLaVA-NeXT checkpoint written as llama.cpp publishes it: the llama text GGUF by
convert_hf_to_gguf.py, and the `mlp` mmproj by llama.cpp's legacy-models route, the one its LLaVA 1.6
instructions give: llava_surgery_v2.py (it also takes `image_newline` into the projector file) and
convert_image_encoder_to_gguf.py with the LLaVA config's image_grid_pinpoints, image_aspect_ratio and
mm_patch_merge_type added to the tower's config.json. Built on tests/helpers/llava_gguf.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.helpers.llama_convert import ensure_converter
from tests.helpers.llava_gguf import (
    _MMPROJ_CONVERT,
    _TEXT_CONVERT,
    _hub_layout,
    _run,
    ensure_legacy_scripts,
)


def _text_only(source: Path, work: Path) -> Path:
    """The converter maps LlavaForConditionalGeneration's text model, and has no name for image_newline."""
    copy = work / "text-input"
    shutil.copytree(source, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(architectures=["LlavaForConditionalGeneration"], model_type="llava")
    (copy / "config.json").write_text(json.dumps(config))
    for path in copy.glob("*.safetensors"):
        tensors = {k: v for k, v in load_file(path).items() if "image_newline" not in k}
        save_file(tensors, path, metadata={"format": "pt"})
    return copy


def write_next_gguf_pair(folder: Path, out: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF), f32, in `out`."""
    root, legacy = ensure_converter(), ensure_legacy_scripts()
    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / f"{out.name}-work"
    source = _hub_layout(folder, work)
    model, mmproj = out / "tiny-llava-next-f32.gguf", out / "mmproj-tiny-llava-next-f32.gguf"
    text = [sys.executable, "-c", _TEXT_CONVERT, str(root), str(_text_only(source, work))]
    _run([*text, "--outfile", str(model), "--outtype", "f32"])
    _run([sys.executable, str(legacy / "llava_surgery_v2.py"), "-C", "-m", str(source)])
    vit = work / "vit"
    vit.mkdir()
    shutil.copy(source / "llava.clip", vit / "pytorch_model.bin")
    shutil.copy(source / "llava.projector", vit / "llava.projector")
    config = json.loads((source / "config.json").read_text())
    vision = {
        **config["vision_config"],
        "architectures": ["CLIPVisionModel"],
        "image_grid_pinpoints": config["image_grid_pinpoints"],
        "image_aspect_ratio": "anyres",
        "mm_patch_merge_type": "spatial_unpad",
    }
    (vit / "config.json").write_text(json.dumps(vision))
    env = {**os.environ, "PYTHONPATH": str(root / "gguf-py")}
    script = [sys.executable, "-c", _MMPROJ_CONVERT, str(legacy / "convert_image_encoder_to_gguf.py")]
    _run([*script, "-m", str(vit), "--llava-projector", str(vit / "llava.projector"), "--output-dir",
          str(vit), "--clip-model-is-vision", "--use-f32"], env=env)  # fmt: skip
    shutil.move(vit / "mmproj-model-f32.gguf", mmproj)
    shutil.rmtree(work)
    return model, mmproj
