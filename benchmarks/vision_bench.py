"""One 896x896 picture through the real engine and torch runner on random weights shaped like Gemma 3 4B's
vision side (SigLIP so400m: 27 layers, width 1152, 4096 patches pooled to 256 image tokens; projector to
width 2560) in front of a shortened language model of the 4B's width (--text-layers, default 2; a small
vocabulary keeps the folder small). Prints: decode + preprocess time, vision encode time, TTFT of the
first turn (preprocess + encode + prefill), TTFT of a second turn with the same picture (encoder cache and
prefix cache hits), and the memory one cached picture holds.

python benchmarks/vision_bench.py [--text-layers 2] [--dtype auto] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.vision_timing import print_results, random_picture, timed_turns, vision_args, write_tokenizer

SIZE = 896
VISION = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "image_size": SIZE,
    "patch_size": 14,
}
TEXT_QUESTION = [2, 3, 5, 6, 7, 8, 9, 10, 11, 12]  # bos, turn start, a few words
BOI, EOI, IMAGE = 297, 298, 299


def _write_folder(folder: Path, text_layers: int) -> None:
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": text_layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 300,
        "sliding_window": 1024,
    }
    config = Gemma3Config(
        text_config=text,
        vision_config=VISION,
        mm_tokens_per_image=256,
        image_token_index=IMAGE,
        boi_token_index=BOI,
        eoi_token_index=EOI,
    )
    torch.manual_seed(0)
    model: Any = Gemma3ForConditionalGeneration(config)
    model.to(torch.bfloat16).eval().save_pretrained(folder)
    write_tokenizer(folder, 300)


def _run(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from localchat.engine.request import ImageInput
    from localchat.vision.gemma3_preprocess import ImageSpec, content_hash, decode, preprocess

    prompt = [*TEXT_QUESTION, BOI, *[IMAGE] * 256, EOI, 4, 3, 13]
    placeholders = tuple(i for i, t in enumerate(prompt) if t == IMAGE)

    def prompt_for(data: bytes) -> tuple[list[int], tuple[ImageInput, ...]]:
        pixels = preprocess(decode(data), ImageSpec.from_folder(folder, SIZE))
        return list(prompt), (ImageInput(placeholders, content_hash(data), pixels),)

    return timed_turns(folder, args, 1024, prompt_for, random_picture(SIZE))


def main() -> None:
    args = vision_args(__doc__, text_layers=2).parse_args()
    with tempfile.TemporaryDirectory(prefix="vision-bench-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        _write_folder(folder, args.text_layers)
        print(f"random Gemma-3-4B-shaped vision folder written in {time.perf_counter() - start:.0f} s")
        print_results(_run(folder, args))


if __name__ == "__main__":
    main()
