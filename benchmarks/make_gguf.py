"""Write random-weight GGUF files of real model shapes for speed and memory benchmarks.

python benchmarks/make_gguf.py --shape llama-1b --mix q4_0 --tokenizer-from SmolLM2.gguf --out /tmp/1b.gguf

Random block bytes (with sane float16 scales) instead of quantized random floats: the speed of a
matmul does not depend on the values, and writing 4.5 GB of blocks this way takes seconds. The
tokenizer and chat template are copied from an existing GGUF (SmolLM2's: vocab 49152), so the file
loads in localchat and llama.cpp alike. Tensors are written one at a time (memory stays small).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

# name: (hidden, layers, heads, kv heads, ffn)
SHAPES = {
    "llama-1b": (2048, 16, 32, 8, 8192),
    "llama-3b": (3072, 28, 24, 8, 8192),
    "llama-8b": (4096, 32, 32, 8, 14336),
}
# mix: (attn q/k/o + ffn gate/up, attn v + ffn down, token embedding, output)
MIXES = {
    "q4_0": ("Q4_0", "Q4_0", "Q8_0", "Q8_0"),
    "q4_k_m": ("Q4_K", "Q6_K", "Q4_K", "Q6_K"),  # as llama-quantize's Q4_K_M (Q6_K on some v/down)
    "q5_k_m": ("Q5_K", "Q6_K", "Q5_K", "Q6_K"),  # as llama-quantize's Q5_K_M (Q6_K on some v/down)
    "q8_0": ("Q8_0", "Q8_0", "Q8_0", "Q8_0"),
    "q3_k_m": ("Q3_K", "Q4_K", "Q3_K", "Q6_K"),  # like Q3_K_M (Q4_K on v/down)
    "q2_k": ("Q2_K", "Q3_K", "Q2_K", "Q6_K"),  # like llama-quantize's Q2_K (Q3_K on v/down)
    # as llama-quantize's IQ4_XS without an imatrix: Q5_K on every attn_v (GQA >= 4) and on ffn_down
    # in the first eighth of the layers (see iq4_xs_v_down)
    "iq4_xs": ("IQ4_XS", "Q5_K", "IQ4_XS", "Q6_K"),
}
# mixes whose v/down type applies only to the layers llama-quantize gives more bits (below)
MORE_BITS_ONLY = {"q4_k_m", "q5_k_m"}


def more_bits(layer: int, layers: int) -> bool:
    """llama-quantize's choice of layers for the larger v/down type: the first and last eighth, and
    every third layer between (so a 16-layer Q4_K_M file has Q6_K in 8 layers: 690 MiB at 1B)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


# where each type keeps its float16 scales: (byte offset, count) inside a block
SCALES = {
    "Q4_0": (0, 1),
    "Q8_0": (0, 1),
    "Q2_K": (80, 2),
    "Q3_K": (108, 1),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208, 1),
    "IQ4_XS": (0, 1),
}


def random_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    gtype = GGMLQuantizationType[qtype]
    values, nbytes = GGML_QUANT_SIZES[gtype]
    data = rng.integers(0, 256, size=(rows, cols // values, nbytes), dtype=np.uint8)
    start, count = SCALES[qtype]
    scales = rng.uniform(0.001, 0.01, size=(rows, cols // values, count)).astype(np.float16)
    data[..., start : start + 2 * count] = scales.view(np.uint8)
    return data.reshape(rows, -1)


def copy_tokenizer(writer: GGUFWriter, source: Path) -> int:
    """Copies tokenizer.* fields; returns the vocabulary size."""
    reader = GGUFReader(source)
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            vocab = len(value)
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, kind)
    return vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="llama-1b")
    parser.add_argument("--mix", choices=MIXES, default="q4_0")
    parser.add_argument("--tokenizer-from", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hidden, layers, heads, kv_heads, ffn = SHAPES[args.shape]
    main_type, v_down_type, embd_type, out_type = MIXES[args.mix]
    head_dim = hidden // heads
    writer = GGUFWriter(args.out, "llama")
    writer.add_name(f"random {args.shape} {args.mix}")
    writer.add_context_length(8192)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    vocab = copy_tokenizer(writer, args.tokenizer_from)
    writer.add_vocab_size(vocab)
    tensors: list[tuple[str, str, int, int]] = [("token_embd.weight", embd_type, vocab, hidden)]
    for i in range(layers):
        p = f"blk.{i}."
        more = args.mix not in MORE_BITS_ONLY or more_bits(i, layers)
        v_type = down_type = v_down_type if more else main_type
        if args.mix == "iq4_xs":
            down_type = v_down_type if i < layers // 8 else main_type
        tensors += [
            (p + "attn_norm.weight", "F32", 1, hidden),
            (p + "attn_q.weight", main_type, heads * head_dim, hidden),
            (p + "attn_k.weight", main_type, kv_heads * head_dim, hidden),
            (p + "attn_v.weight", v_type, kv_heads * head_dim, hidden),
            (p + "attn_output.weight", main_type, hidden, heads * head_dim),
            (p + "ffn_norm.weight", "F32", 1, hidden),
            (p + "ffn_gate.weight", main_type, ffn, hidden),
            (p + "ffn_up.weight", main_type, ffn, hidden),
            (p + "ffn_down.weight", down_type, hidden, ffn),
        ]
    tensors += [("output_norm.weight", "F32", 1, hidden), ("output.weight", out_type, vocab, hidden)]
    for name, qtype, rows, cols in tensors:
        if qtype == "F32":
            writer.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        else:
            gtype = GGMLQuantizationType[qtype]
            values, nbytes = GGML_QUANT_SIZES[gtype]
            row_bytes = cols // values * nbytes  # quantized shapes are given in bytes
            writer.add_tensor_info(name, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes, gtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _name, qtype, rows, cols in tensors:
        if qtype == "F32":
            writer.write_tensor_data(np.ones(cols, dtype=np.float32))
        else:
            writer.write_tensor_data(random_blocks(qtype, rows, cols, rng))
    writer.close()
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
