"""`--gpu-layers` on one GPU: single-stream decode and a 512-token prefill of a real-shaped model with
random weights (no download) as more of its layers move from the CPU to the GPU (the LM head is on the
GPU whenever any layer is). Random weights do not change the speed (EOS is ignored).

python benchmarks/gpu_layers_bench.py --shape llama3.2-1b --layers 16 12 8 4 0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_bench import SHAPES, SilentTokenizer, decode_rate, hf_config, random_weights


def build(shape: str, gpu_layers: int) -> object:
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
        lambda: random_weights(config, "bf16"),  # type: ignore[arg-type,return-value]
        tokenizer=None,  # type: ignore[arg-type]
    )
    runner = create_runner("torch", bundle, RunnerOptions(device="cuda", gpu_layers=gpu_layers))
    return LLMEngine(
        runner,
        SilentTokenizer(),
        EngineConfig(max_num_seqs=4, max_model_len=2048, max_num_batched_tokens=2048, kv_cache_mib=1024),
        eos_token_ids=[2],
        model_max_len=8192,
    )


def prefill_seconds(engine: object, tokens: int) -> float:
    from localchat.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.add_request(list(range(10, 10 + tokens)), params)  # type: ignore[attr-defined]
    start = time.perf_counter()
    while engine.has_unfinished:  # type: ignore[attr-defined]
        engine.step()  # type: ignore[attr-defined]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, nargs="+", default=[16, 12, 8, 4, 0])
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    total = int(SHAPES[args.shape]["num_hidden_layers"])
    print(f"{args.shape}, bf16 weights; --gpu-layers N of {total}")
    print("| --gpu-layers | decode tok/s (1 stream) | 512-token prefill s |")
    print("|---|---|---|")
    for count in args.layers:
        engine = build(args.shape, count)
        prefill_seconds(engine, 16)  # warm-up
        prefill = prefill_seconds(engine, 512)
        rate = decode_rate(engine, args.new_tokens)
        print(f"| {count} | {rate:.1f} | {prefill:.3f} |", flush=True)
        del engine


if __name__ == "__main__":
    main()
