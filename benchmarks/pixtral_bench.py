"""One picture through a random-weight Mistral-Small-3.1-shaped vision side on the torch backend: the
Pixtral tower (24 layers of width 1024, 16 heads, 14 px patches, 2-D RoPE) and Mistral 3's projector (2x2
patch merger, into width 5120). Prints the preprocessing time, the encode time, the image tokens (rows of
[IMG] plus one [IMG_BREAK] / [IMG_END] per row) and the memory one cached encoding holds. The text model
is not built (a 24B's prefill is not this benchmark's business).

python benchmarks/pixtral_bench.py [--size 512] [--dtype bfloat16] [--threads N]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIG = {
    "model_type": "mistral3",
    "spatial_merge_size": 2,
    "image_token_index": 10,
    "text_config": {"hidden_size": 5120, "rms_norm_eps": 1e-5},
    "vision_config": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "image_size": 1540,
        "patch_size": 14,
        "hidden_act": "silu",
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=512, help="the picture's side in pixels")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    import numpy as np
    import torch
    from PIL import Image

    from localchat.backends.torch.vision.pixtral import PixtralVision
    from localchat.vision.gemma3_preprocess import decode
    from localchat.vision.pixtral_preprocess import PixtralImageSpec, preprocess_pixtral

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    vision = PixtralVision(CONFIG).to(dtype).eval()
    buffer = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)).save(buffer, "PNG")

    start = time.perf_counter()
    pixels = preprocess_pixtral(decode(buffer.getvalue()), PixtralImageSpec(longest_edge=1540, unit=28))
    prep = time.perf_counter() - start
    start = time.perf_counter()
    embeds = vision.encode(torch.from_numpy(pixels)[None].to(dtype))[0]
    encode = time.perf_counter() - start
    rows, columns = pixels.shape[1] // 28, pixels.shape[2] // 28
    print(f"picture {args.size} x {args.size} -> {pixels.shape[1]} x {pixels.shape[2]} px, "
          f"{pixels.shape[1] // 14 * pixels.shape[2] // 14} patches")  # fmt: skip
    print(f"image tokens: {rows * columns} [IMG] + {rows} break/end = {rows * (columns + 1)}")
    print(
        f"preprocess: {prep * 1000:.0f} ms; encode ({args.dtype}, {torch.get_num_threads()} threads): {encode:.1f} s"
    )
    size = embeds.numel() * embeds.element_size()
    print(f"one cached encoding: {tuple(embeds.shape)} {args.dtype} = {size / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
