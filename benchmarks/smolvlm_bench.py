"""One 896x896 picture through the real engine and torch runner on random weights shaped like
SmolVLM-256M-Instruct (SigLIP tower: 12 layers, width 768, 512 px tiles of 16 px patches, pixel shuffle by 4
into the text width 576; the picture resized to a 2048 px longest edge, so 4 x 4 tiles + the global image =
17 tiles, 1,088 image tokens) in front of its SmolLM2-135M-shaped text model (--text-layers, default 30).
Prints: decode + preprocess time, vision encode time, TTFT of the first turn (preprocess + encode +
prefill), TTFT of a second turn with the same picture (encoder cache and prefix cache hits), and the memory
one cached picture holds.

python benchmarks/smolvlm_bench.py [--text-layers 30] [--dtype auto] [--threads N] [--size 896]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.vision_timing import print_results, random_picture, timed_turns, vision_args, write_tokenizer

VISION = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 512,
    "patch_size": 16,
}
IMAGE = 299
QUESTION = [1, 3, 5, 6, 7, 8, 9, 10, 11, 12]
# SmolVLM-256M-Instruct's preprocessor_config.json (the sizes that decide the tiling)
PREPROCESSOR = {
    "do_image_splitting": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 512},
    "resample": 1,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 2048},
}


def _write_folder(folder: Path, text_layers: int) -> None:
    import torch
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    text = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": text_layers,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 300,
        "max_position_embeddings": 8192,
    }
    torch.manual_seed(0)
    model: Any = SmolVLMForConditionalGeneration(
        SmolVLMConfig(text_config=text, vision_config=VISION, image_token_id=IMAGE, scale_factor=4)
    )
    model.to(torch.bfloat16).eval().save_pretrained(folder)
    write_tokenizer(folder, 300)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))


def _run(folder: Path, args: Any) -> dict[str, Any]:
    from localchat.engine.request import ImageInput
    from localchat.vision.gemma3_preprocess import content_hash, decode
    from localchat.vision.smolvlm_prompt import SmolVLMImagePrompt

    prompt_side = SmolVLMImagePrompt.from_config(folder, json.loads((folder / "config.json").read_text()))

    def prompt_for(data: bytes) -> tuple[list[int], tuple[ImageInput, ...]]:
        pixels, (rows, cols) = prompt_side.preprocess(decode(data))
        tiles = rows * cols + 1
        prompt = [*QUESTION, *[IMAGE] * (tiles * prompt_side.per_tile), 4, 3, 13]  # markers left out
        return prompt, prompt_side.inputs(prompt, [(content_hash(data), pixels, (rows, cols))])

    return timed_turns(folder, args, 4096, prompt_for, random_picture(args.size))


def main() -> None:
    parser = vision_args(__doc__, text_layers=30)
    parser.add_argument("--size", type=int, default=896, help="the square picture's side in pixels")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smolvlm-bench-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        _write_folder(folder, args.text_layers)
        print(f"random SmolVLM-256M-shaped folder written in {time.perf_counter() - start:.0f} s")
        print_results(_run(folder, args))


if __name__ == "__main__":
    main()
