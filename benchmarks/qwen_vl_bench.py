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
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
    from tokenizers import Tokenizer, models
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
    vocab = {f"t{i}": i for i in range(300)}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    # the hub processor's pixel bounds (Qwen/Qwen2.5-VL-7B-Instruct)
    (folder / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 12845056}))


def _picture(size: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def _run(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from localchat.backends import RunnerOptions
    from localchat.backends.torch.runner import TorchRunner
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams
    from localchat.vision.gemma3_preprocess import content_hash, decode
    from localchat.vision.qwen_vl_prompt import QwenImagePrompt
    from localchat.weights.loader import load_model

    bundle = load_model(folder)
    runner = TorchRunner(bundle, RunnerOptions(device="cpu", dtype=args.dtype, num_threads=args.threads))
    config = EngineConfig(kv_cache_mib=256, prefill_chunk_size=512)
    engine = LLMEngine(runner, bundle.tokenizer, config, eos_token_ids=[], model_max_len=2048)
    embedder = runner.images
    assert embedder is not None, "the folder's vision tower did not load"
    encode_s: list[float] = []
    inner = embedder._encode

    def timed_encode(part: Any) -> Any:
        start = time.perf_counter()
        out = inner(part)
        encode_s.append(time.perf_counter() - start)
        return out

    embedder._encode = timed_encode  # type: ignore[method-assign]
    prompt_side = QwenImagePrompt.from_config(folder, json.loads((folder / "config.json").read_text()))
    data = _picture(args.size)

    def first_token() -> tuple[float, float, int, int]:
        """(TTFT s, decode + preprocess s, prompt tokens, prompt tokens served from the prefix cache)"""
        start = time.perf_counter()
        pixels, grid = prompt_side.preprocess(decode(data))
        prep = time.perf_counter() - start
        prompt = [*QUESTION, START, *[IMAGE] * (grid[0] * grid[1] * grid[2]), END, 4, 3, 13]
        images = prompt_side.inputs(prompt, [(content_hash(data), pixels, grid)])
        engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0), images=images)
        cached = 0
        while engine.has_unfinished:
            for out in engine.step():
                cached = out.num_cached_tokens
        return time.perf_counter() - start, prep, len(prompt), cached

    ttft1, prep, length, _ = first_token()
    ttft2, _, _, cached = first_token()
    (embeds,) = list(embedder.cache._items.values())
    return {
        "dtype": str(runner.dtype).removeprefix("torch."),
        "prompt tokens": length,
        "decode + preprocess (ms)": prep * 1000,
        "vision encode (s)": encode_s[0],
        "TTFT turn 1 (s)": ttft1,
        "TTFT turn 2, same picture (s)": ttft2,
        "turn 2 prefix-cache tokens": cached,
        "encoder runs": len(encode_s),
        "memory per cached picture (MiB)": embeds.numel() * embeds.element_size() / 2**20,
        "cached picture shape": tuple(embeds.shape),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--text-layers", type=int, default=1)
    parser.add_argument("--dtype", default="auto", help="runner dtype: auto | float32 | bfloat16")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--size", type=int, default=896, help="the square picture's side in pixels")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qwen-vl-bench-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        _write_folder(folder, args.text_layers)
        print(f"random Qwen2.5-VL-7B-shaped vision folder written in {time.perf_counter() - start:.0f} s")
        results = _run(folder, args)
    width = max(len(k) for k in results)
    for key, value in results.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")


if __name__ == "__main__":
    main()
