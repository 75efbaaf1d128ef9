"""What vision_bench.py (Gemma 3) and qwen_vl_bench.py (Qwen2.5-VL) share: a random picture, a word-level
tokenizer for their random folders, and the timed run: one picture's first turn and a second turn with the
same picture (encoder cache and prefix cache hits), on the real engine and torch runner.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A prompt for one picture's bytes: (prompt token ids, the engine's ImageInputs)
PromptFor = Callable[[bytes], tuple[list[int], tuple[Any, ...]]]


def random_picture(size: int) -> bytes:
    """A size x size PNG of random pixels (the same each run)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer.json of `vocab_size` tokens: the random folders need one to load."""
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(vocab_size)}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())


def timed_turns(
    folder: Path, args: argparse.Namespace, model_max_len: int, prompt_for: PromptFor, data: bytes
) -> dict[str, Any]:
    """Load `folder`, then run the picture `data` twice (one token each) with `prompt_for` making the
    prompt (its preprocessing is timed with it): the timings and the cached picture's memory."""
    from localchat.backends import RunnerOptions
    from localchat.backends.torch.runner import TorchRunner
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams
    from localchat.weights.loader import load_model

    bundle = load_model(folder)
    runner = TorchRunner(bundle, RunnerOptions(device="cpu", dtype=args.dtype, num_threads=args.threads))
    config = EngineConfig(kv_cache_mib=256, prefill_chunk_size=512)
    engine = LLMEngine(runner, bundle.tokenizer, config, eos_token_ids=[], model_max_len=model_max_len)
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

    def first_token() -> tuple[float, float, int, int]:
        """(TTFT s, decode + preprocess s, prompt tokens, prompt tokens served from the prefix cache)"""
        start = time.perf_counter()
        prompt, images = prompt_for(data)
        prep = time.perf_counter() - start
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


def vision_args(doc: str | None, text_layers: int) -> argparse.ArgumentParser:
    """The flags both benchmarks take (each may add its own)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text-layers", type=int, default=text_layers)
    parser.add_argument("--dtype", default="auto", help="runner dtype: auto | float32 | bfloat16")
    parser.add_argument("--threads", type=int, default=None)
    return parser


def print_results(results: dict[str, Any]) -> None:
    width = max(len(k) for k in results)
    for key, value in results.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
