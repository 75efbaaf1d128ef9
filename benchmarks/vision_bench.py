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
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
    from tokenizers import Tokenizer, models
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
    vocab = {f"t{i}": i for i in range(300)}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())


def _picture() -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def _run(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from localchat.backends import RunnerOptions
    from localchat.backends.torch.runner import TorchRunner
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.engine.request import ImageInput
    from localchat.engine.sampling_params import SamplingParams
    from localchat.vision.gemma3_preprocess import ImageSpec, content_hash, decode, preprocess
    from localchat.weights.loader import load_model

    bundle = load_model(folder)
    runner = TorchRunner(bundle, RunnerOptions(device="cpu", dtype=args.dtype, num_threads=args.threads))
    config = EngineConfig(kv_cache_mib=256, prefill_chunk_size=512)
    engine = LLMEngine(runner, bundle.tokenizer, config, eos_token_ids=[], model_max_len=1024)
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
    prompt = [*TEXT_QUESTION, BOI, *[IMAGE] * 256, EOI, 4, 3, 13]
    placeholders = tuple(i for i, t in enumerate(prompt) if t == IMAGE)
    data = _picture()

    def first_token() -> tuple[float, float, int]:
        """(TTFT s, decode + preprocess s, prompt tokens served from the prefix cache)"""
        start = time.perf_counter()
        pixels = preprocess(decode(data), ImageSpec.from_folder(folder, SIZE))
        prep = time.perf_counter() - start
        image = ImageInput(placeholders, content_hash(data), pixels)
        engine.add_request(list(prompt), SamplingParams(max_tokens=1, temperature=0.0), images=(image,))
        cached = 0
        while engine.has_unfinished:
            for out in engine.step():
                cached = out.num_cached_tokens
        return time.perf_counter() - start, prep, cached

    ttft1, prep, _ = first_token()
    ttft2, _, cached = first_token()
    (embeds,) = list(embedder.cache._items.values())
    return {
        "dtype": str(runner.dtype).removeprefix("torch."),
        "prompt tokens": len(prompt),
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
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--dtype", default="auto", help="runner dtype: auto | float32 | bfloat16")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vision-bench-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        _write_folder(folder, args.text_layers)
        print(f"random Gemma-3-4B-shaped vision folder written in {time.perf_counter() - start:.0f} s")
        results = _run(folder, args)
    width = max(len(k) for k in results)
    for key, value in results.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")


if __name__ == "__main__":
    main()
