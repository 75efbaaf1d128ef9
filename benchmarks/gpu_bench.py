"""GPU benchmark on a real-shaped model with random weights (no download): the engine's single-stream
decode, 16 and 64 concurrent requests and TTFT for a 2k-token prompt, against the HBM bound and,
optionally, HF transformers on the same GPU. Random weights do not change the speed (EOS is ignored).

python benchmarks/gpu_bench.py --shape llama3-8b --quant bf16 --peer
python benchmarks/gpu_bench.py --shape llama3-8b --quant q4_0
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
    },
    "llama3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
    },
}


class SilentTokenizer:
    """The engine detokenizes as it goes; random weights make text meaningless, so decode to nothing."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def hf_config(shape: str) -> dict[str, object]:
    return {
        "model_type": "llama",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **SHAPES[shape],
    }


def random_weights(config: dict[str, object], quant: str) -> Iterator[object]:
    """HF-named weights; one random array per shape, reused by every layer (speed ignores values)."""
    from localchat.weights.tensors import WeightTensor

    rng = np.random.default_rng(0)
    hidden, ffn = int(config["hidden_size"]), int(config["intermediate_size"])  # type: ignore[call-overload]
    heads, kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])  # type: ignore[call-overload]
    head_dim, vocab = hidden // heads, int(config["vocab_size"])  # type: ignore[call-overload]
    cache: dict[tuple[int, int, str], np.ndarray] = {}

    def matrix(name: str, rows: int, cols: int, dtype: str) -> WeightTensor:
        key = (rows, cols, dtype)
        if key not in cache:
            if dtype == "BF16":
                values = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).view(np.uint32)
                cache[key] = (values >> 16).astype(np.uint16)
            else:  # Q4_0: fp16 scale + 16 bytes of nibbles per 32 values
                groups = cols // 32
                scales = rng.uniform(0.001, 0.01, (rows, groups)).astype(np.float16).view(np.uint8)
                nibbles = rng.integers(0, 256, (rows, groups, 16), dtype=np.uint8)
                cache[key] = np.concatenate([scales.reshape(rows, groups, 2), nibbles], -1).reshape(rows, -1)
        return WeightTensor(name, (rows, cols), dtype, cache[key])

    linear = "Q4_0" if quant == "q4_0" else "BF16"
    ones = np.ones(hidden, dtype=np.float32)
    yield matrix("model.embed_tokens.weight", vocab, hidden, "BF16")
    for i in range(int(config["num_hidden_layers"])):  # type: ignore[call-overload]
        p = f"model.layers.{i}."
        yield WeightTensor(p + "input_layernorm.weight", (hidden,), "F32", ones)
        yield WeightTensor(p + "post_attention_layernorm.weight", (hidden,), "F32", ones)
        for proj, rows in (("q", heads * head_dim), ("k", kv * head_dim), ("v", kv * head_dim)):
            yield matrix(f"{p}self_attn.{proj}_proj.weight", rows, hidden, linear)
        yield matrix(p + "self_attn.o_proj.weight", hidden, heads * head_dim, linear)
        yield matrix(p + "mlp.gate_proj.weight", ffn, hidden, linear)
        yield matrix(p + "mlp.up_proj.weight", ffn, hidden, linear)
        yield matrix(p + "mlp.down_proj.weight", hidden, ffn, linear)
    yield WeightTensor("model.norm.weight", (hidden,), "F32", ones)
    yield matrix("lm_head.weight", vocab, hidden, linear)


def build_engine(shape: str, quant: str, graphs: bool, max_num_seqs: int) -> tuple[object, float, int]:
    import torch

    from localchat.backends import RunnerOptions, create_runner
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.weights.bundle import ModelBundle
    from localchat.weights.config import ModelConfig

    config = hf_config(shape)
    bundle = ModelBundle(
        shape,
        Path(shape),
        "gguf",
        ModelConfig.from_hf_dict(config),
        lambda: random_weights(config, quant),  # type: ignore[arg-type,return-value]
        tokenizer=None,  # type: ignore[arg-type]
    )
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    runner = create_runner("torch", bundle, RunnerOptions(device="cuda", cuda_graphs=graphs))
    weight_bytes = torch.cuda.memory_allocated() - before
    engine = LLMEngine(
        runner,
        SilentTokenizer(),
        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=4096, max_num_batched_tokens=4096),
        eos_token_ids=[2],
        model_max_len=8192,
    )
    return engine, time.perf_counter() - start, weight_bytes


def run_requests(engine: object, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(output tok/s over the whole run, seconds to the first token of the first request)."""
    from localchat.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    for prompt in prompts:
        engine.add_request(prompt, params)  # type: ignore[attr-defined]
    first, produced = None, 0
    while engine.has_unfinished:  # type: ignore[attr-defined]
        for out in engine.step():  # type: ignore[attr-defined]
            produced += len(out.new_token_ids)
            if first is None and out.new_token_ids:
                first = time.perf_counter() - start
    return produced / (time.perf_counter() - start), first or 0.0


def decode_rate(engine: object, new_tokens: int) -> float:
    """Single stream, decode only: tokens after the first over the time after the first."""
    from localchat.engine.sampling_params import SamplingParams

    engine.add_request(
        list(range(10, 42)), SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    )  # type: ignore[attr-defined]
    first = None
    while engine.has_unfinished:  # type: ignore[attr-defined]
        outs = engine.step()  # type: ignore[attr-defined]
        if first is None and any(o.new_token_ids for o in outs):
            first = time.perf_counter()
    assert first is not None
    return (new_tokens - 1) / (time.perf_counter() - first)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the HBM figure the bound uses)."""
    import torch

    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * 10 * src.numel() / (time.perf_counter() - start)


def peer_transformers(shape: str, new_tokens: int, batch: int) -> float:
    """HF transformers, bf16, greedy, same shape and random init: output tok/s."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**hf_config(shape)))
    model = model.to_empty(device="cuda").to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    ids = torch.arange(10, 42, device="cuda").repeat(batch, 1)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        torch.cuda.synchronize()
    rate = batch * new_tokens / (time.perf_counter() - start)
    del model
    torch.cuda.empty_cache()
    return rate


def model_parser(doc: str) -> argparse.ArgumentParser:
    """The options every GPU benchmark on these random-weight models takes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--quant", choices=("bf16", "q4_0"), default="bf16")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    return parser


def main() -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--peer", action="store_true", help="also time HF transformers (bf16 only)")
    args = parser.parse_args()

    import torch

    engine, load_s, weight_bytes = build_engine(args.shape, args.quant, not args.no_cuda_graphs, 64)
    rng = np.random.default_rng(1)
    single = decode_rate(engine, args.new_tokens)
    rows = [("single-stream decode", single)]
    for n in (16, 64):
        prompts = [rng.integers(10, 30000, 32).tolist() for _ in range(n)]
        rows.append((f"{n} concurrent, output", run_requests(engine, prompts, args.new_tokens)[0]))
    _, ttft = run_requests(engine, [rng.integers(10, 30000, 2048).tolist()], 1)
    bandwidth = copy_bandwidth()
    bound = bandwidth / weight_bytes
    name = torch.cuda.get_device_name()
    print(
        f"\n{args.shape} {args.quant} on {name}: weights {weight_bytes / 2**30:.2f} GiB, load {load_s:.1f}s"
    )
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s -> single-stream bound {bound:.0f} tok/s\n")
    print("| workload | localchat tok/s | vs bound |" + (" transformers tok/s |" if args.peer else ""))
    print("|---|---|---|" + ("---|" if args.peer else ""))
    peer_rates: dict[str, float] = {}
    if args.peer and args.quant == "bf16":
        del engine
        torch.cuda.empty_cache()
        peer_rates = {
            "single-stream decode": peer_transformers(args.shape, args.new_tokens, 1),
            "16 concurrent, output": peer_transformers(args.shape, args.new_tokens, 16),
        }
    for label, rate in rows:
        vs = f"{rate / bound:.0%}" if label.startswith("single") else ""
        peer = f" {peer_rates[label]:.0f} |" if label in peer_rates else (" — |" if args.peer else "")
        print(f"| {label} | {rate:.0f} | {vs} |{peer}")
    print(f"| TTFT, 2048-token prompt | {ttft * 1000:.0f} ms | | |")


if __name__ == "__main__":
    main()
