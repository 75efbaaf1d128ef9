"""A LLaVA checkpoint (LlavaForConditionalGeneration safetensors folder) written as llama.cpp publishes
it: a llama text GGUF by convert_hf_to_gguf.py, and the `mlp` mmproj by llama.cpp's own LLaVA route,
its legacy-models scripts (llava_surgery_v2.py splits the tower and projector out of the checkpoint,
convert_image_encoder_to_gguf.py --clip-model-is-vision writes the mmproj). convert_hf_to_gguf.py's
--mmproj takes LlavaForConditionalGeneration only for Pixtral towers ("Unsupported model type:
clip_vision_model" for CLIP), which is why the published LLaVA 1.5 / 1.6 mmproj files come from these
scripts. The scripts are taken from the same llama-cpp-python sdist as the converter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.helpers.llama_convert import REPO, ensure_converter, from_sdist

_LEGACY = "tools/mtmd/legacy-models/"
# The scripts read the hub layout (transformers 4.5x names): the tower under vision_tower.vision_model.
_RENAMES = (("model.vision_tower.vision_model.", "vision_tower.vision_model."),
            ("model.vision_tower.", "vision_tower.vision_model."),
            ("vision_tower.vision_model.", "vision_tower.vision_model."),
            ("vision_tower.", "vision_tower.vision_model."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
            ("model.language_model.", "language_model.model."),
            ("lm_head.", "language_model.lm_head."))  # fmt: skip
_TEXT_CONVERT = """
import runpy, sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "whitespace"
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# The mmproj script was written for transformers 4's CLIPVisionModel (its modules under .vision_model);
# transformers 5 keeps them at the top, so the script gets the old layout around the loaded model.
_MMPROJ_CONVERT = """
import runpy, sys, torch, transformers
class V4Layout(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.vision_model = inner
load = transformers.CLIPVisionModel.from_pretrained
transformers.CLIPVisionModel.from_pretrained = lambda *a, **k: V4Layout(load(*a, **k))
sys.argv.pop(0)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def ensure_legacy_scripts(directory: Path = REPO / ".models") -> Path:
    """The folder holding llama.cpp's legacy-models scripts; skips the test when no package index answers."""
    target = directory / "llama.cpp-legacy-models"
    return from_sdist(target, "convert_image_encoder_to_gguf.py", _LEGACY, lambda member, _: member.isfile())


def round_to_f16(hf: torch.nn.Module) -> None:
    """The mmproj script stores the patch conv and the projector matrices in f16 whatever it is told:
    weights already f16-exact make the f32 pair the same model as the folder, so comparisons stay tight."""
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "patch_embedding" in name or ("multi_modal_projector" in name and name.endswith("weight")):
                param.copy_(param.half().float())


def _hub_layout(folder: Path, work: Path) -> Path:
    copy = work / "convert-input"
    shutil.copytree(folder, copy)
    for path in copy.glob("*.safetensors"):
        renamed = {}
        for key, value in load_file(path).items():
            for old, new in _RENAMES:
                if key.startswith(old):
                    key = new + key[len(old) :]
                    break
            renamed[key] = value
        save_file(renamed, path, metadata={"format": "pt"})
    return copy


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])


def write_gguf_pair(folder: Path, out: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF), f32, in `out`."""
    root, legacy = ensure_converter(), ensure_legacy_scripts()
    out.mkdir(parents=True, exist_ok=True)
    work = out.parent / f"{out.name}-work"
    source = _hub_layout(folder, work)
    model, mmproj = out / "tiny-llava-f32.gguf", out / "mmproj-tiny-llava-f32.gguf"
    text = [sys.executable, "-c", _TEXT_CONVERT, str(root), str(source), "--outfile", str(model)]
    _run([*text, "--outtype", "f32"])
    # step 1: llava.clip (the tower) and llava.projector beside the checkpoint
    _run([sys.executable, str(legacy / "llava_surgery_v2.py"), "-C", "-m", str(source)])
    # step 2: the tower as a CLIP vision folder, then the mmproj
    vit = work / "vit"
    vit.mkdir()
    shutil.copy(source / "llava.clip", vit / "pytorch_model.bin")
    shutil.copy(source / "llava.projector", vit / "llava.projector")
    config = json.loads((source / "config.json").read_text())
    (vit / "config.json").write_text(
        json.dumps({**config["vision_config"], "architectures": ["CLIPVisionModel"]})
    )
    env = {**os.environ, "PYTHONPATH": str(root / "gguf-py")}
    script = [
        sys.executable,
        "-c",
        _MMPROJ_CONVERT,
        str(legacy / "convert_image_encoder_to_gguf.py"),
        "-m",
        str(vit),
    ]
    _run([*script, "--llava-projector", str(vit / "llava.projector"), "--output-dir", str(vit),
          "--clip-model-is-vision", "--use-f32"], env=env)  # fmt: skip
    shutil.move(vit / "mmproj-model-f32.gguf", mmproj)
    shutil.rmtree(work)
    return model, mmproj
