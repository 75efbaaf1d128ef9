"""One 896x896 picture through the real engine and torch runner on random weights shaped like Qwen2.5-VL-7B's
vision side (32 layers, width 1280, 112-pixel windows with 4 full-attention layers, 4,096 patches merged to
1,024 image tokens of width 3584) in front of a shortened language model of the 7B's width (--text-layers,
default 1; a small vocabulary keeps the folder small). Prints: decode + preprocess time, vision encode time,
TTFT of the first turn (preprocess + encode + prefill), TTFT of a second turn with the same picture (encoder
cache and prefix cache hits), and the memory one cached picture holds.

python benchmarks/qwen_vl_bench.py [--text-layers 1] [--dtype auto] [--threads N] [--size 896]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.vision_timing import print_results, random_picture, timed_turns, vision_args, write_tokenizer

VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}
IMAGE, START, END = 297, 298, 299
QUESTION = [1, 3, 5, 6, 7, 8, 9, 10, 11, 12]


def _write_folder(folder: Path, text_layers: int) -> None:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    rope = {"rope_type": "default", "type": "mrope", "mrope_section": [16, 24, 24], "rope_theta": 1e6}
    text = {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": text_layers,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 300,
        "rope_parameters": rope,
    }
    ids: dict[str, Any] = {
        "image_token_id": IMAGE,
        "video_token_id": 296,
        "vision_start_token_id": START,
        "vision_end_token_id": END,
    }
    torch.manual_seed(0)
    model: Any = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=text, vision_config=VISION, **ids)
    )
    model.to(torch.bfloat16).eval().save_pretrained(folder)
    write_tokenizer(folder, 300)
    # the hub processor's pixel bounds (Qwen/Qwen2.5-VL-7B-Instruct)
    (folder / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 12845056}))


def _run(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from localchat.engine.request import ImageInput
    from localchat.vision.gemma3_preprocess import content_hash, decode
    from localchat.vision.qwen_vl_prompt import QwenImagePrompt

    prompt_side = QwenImagePrompt.from_config(folder, json.loads((folder / "config.json").read_text()))

    def prompt_for(data: bytes) -> tuple[list[int], tuple[ImageInput, ...]]:
        pixels, grid = prompt_side.preprocess(decode(data))
        prompt = [*QUESTION, START, *[IMAGE] * (grid[0] * grid[1] * grid[2]), END, 4, 3, 13]
        return prompt, prompt_side.inputs(prompt, [(content_hash(data), pixels, grid)])

    return timed_turns(folder, args, 2048, prompt_for, random_picture(args.size))


def main() -> None:
    parser = vision_args(__doc__, text_layers=1)
    parser.add_argument("--size", type=int, default=896, help="the square picture's side in pixels")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qwen-vl-bench-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        _write_folder(folder, args.text_layers)
        print(f"random Qwen2.5-VL-7B-shaped vision folder written in {time.perf_counter() - start:.0f} s")
        print_results(_run(folder, args))


if __name__ == "__main__":
    main()
