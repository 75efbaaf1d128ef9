"""Write a random-weight Qwen3.5-shaped GGUF (hybrid gated DeltaNet + full attention) for speed benchmarks.

python benchmarks/make_hybrid_gguf.py --out-dir /tmp/qwen35-2b [--quant Q4_K_M --quant Q8_0] \
    --llama-bin ~/llama.cpp/build/bin

The shape is Qwen3.5-2B's text model as published (hidden 2048, 24 layers with every 4th full attention,
16 DeltaNet key and value heads of 128, 8 query heads / 2 KV heads of 256, MLP 6144, tied embeddings,
vocabulary 248,320): ~1.9B parameters. Steps, one model in memory at a time:
1. transformers' Qwen3_5ForCausalLM built in bfloat16 with its own initialisation (std 0.02 linears,
   zero-centred norms, A_log and dt_bias as trained models start), saved as a folder (~3.8 GB);
2. a tokenizer for the folder: llama.cpp's own `qwen35` test vocabulary (.models/llama.cpp-vocab, Qwen2's
   151,936 tokens and merges with Qwen3.5's split) and its ChatML template; the converter pads the
   vocabulary to 248,320 as it does for real files, so the embedding and LM head have Qwen3.5's size;
3. llama.cpp's convert_hf_to_gguf.py -> bf16 GGUF (the folder is deleted after), then llama-quantize to
   each `--quant` type. Random weights: speed and memory only, the text it writes is noise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
VOCAB_FILE = ROOT / ".models" / "llama.cpp-vocab" / "ggml-vocab-qwen35.gguf"

# Qwen3.5-2B's text config (the values transformers' Qwen3_5TextConfig takes).
SHAPE: dict[str, Any] = dict(
    vocab_size=248_320, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=262_144,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=True, rms_norm_eps=1e-6,
)  # fmt: skip

# The converter checks the tokenizer's pre-tokenizer hash against known releases; this folder's is the
# test vocabulary's, so the answer is given (the file then says `qwen35`, as Qwen3.5's GGUFs do).
_CONVERT = """
import sys
sys.path[:0] = [{root!r}, {root!r} + "/gguf-py"]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
convert_hf_to_gguf.main()
"""


def write_model(folder: Path, seed: int) -> int:
    """Saves the random bf16 model; returns its parameter count."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    layers = SHAPE["num_hidden_layers"]
    kinds = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    config = Qwen3_5TextConfig(**SHAPE, layer_types=kinds, eos_token_id=151645, bos_token_id=None)
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)  # never a float32 copy: 3.8 GB instead of 7.6
    try:
        model = Qwen3_5ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    count = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    del model
    return count


def write_tokenizer(folder: Path) -> None:
    from gguf import GGUFReader

    from localchat.weights.gguf import gguf_value
    from localchat.weights.gguf_tokenizer import GGUFVocab, build_backend

    reader = GGUFReader(VOCAB_FILE)
    build_backend(GGUFVocab.read(reader)).save(str(folder / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": gguf_value(reader, "tokenizer.chat_template"),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))


def convert(folder: Path, out: Path) -> None:
    from tests.helpers.llama_convert import ensure_converter

    script = _CONVERT.format(root=str(ensure_converter()))
    cmd = [sys.executable, "-c", script, str(folder), "--outfile", str(out), "--outtype", "bf16", "--no-mtp"]
    subprocess.run(cmd, check=True)


def quantize(llama_bin: Path, source: Path, out: Path, qtype: str) -> None:
    subprocess.run([str(llama_bin / "llama-quantize"), str(source), str(out), qtype], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--llama-bin", type=Path, help="folder with llama-quantize (none: bf16 only)")
    parser.add_argument("--quant", action="append", default=[], help="llama-quantize type, e.g. Q4_K_M")
    parser.add_argument("--keep-bf16", action="store_true", help="keep the bf16 GGUF after quantizing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    bf16 = args.out_dir / "qwen35-2b-random-bf16.gguf"
    if not bf16.exists():
        folder = args.out_dir / "hf"
        start = time.perf_counter()
        count = write_model(folder, args.seed)
        write_tokenizer(folder)
        print(f"wrote {folder} ({count / 1e9:.2f}B parameters, {time.perf_counter() - start:.0f} s)")
        try:
            convert(folder, bf16)
        finally:
            shutil.rmtree(folder)
    for qtype in args.quant:
        if args.llama_bin is None:
            raise SystemExit("--quant needs --llama-bin (the folder with llama-quantize)")
        out = args.out_dir / f"qwen35-2b-random-{qtype.lower()}.gguf"
        quantize(args.llama_bin, bf16, out, qtype)
        print(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MiB)")
    if args.quant and not args.keep_bf16:
        bf16.unlink()


if __name__ == "__main__":
    main()
