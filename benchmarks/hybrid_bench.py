"""Hybrid (Qwen3.5: gated DeltaNet + full attention) against the same shape with every layer full
attention, through the real engine and torch runner on random weights: prefill tok/s of one prompt,
decode tok/s at 1 and N sequences, and the state bytes per sequence. Both engines live in one process and
are measured in alternating rounds (best of `--rounds`), so load from other processes hits both alike.

python benchmarks/hybrid_bench.py [--hidden 1024] [--layers 8] [--prompt 512] [--decode 64] [--seqs 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _bundle(args: argparse.Namespace, hybrid: bool) -> Any:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from tests.helpers.torch_models import bundle_from_hf

    layers = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(args.layers)]
    config = Qwen3_5TextConfig(
        vocab_size=32_000,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 128,
        num_key_value_heads=2,
        head_dim=128,
        linear_num_key_heads=args.hidden // 128,
        linear_num_value_heads=args.hidden // 64,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        layer_types=layers if hybrid else ["full_attention"] * args.layers,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )
    torch.manual_seed(0)
    return bundle_from_hf(Qwen3_5ForCausalLM(config).eval(), "hybrid" if hybrid else "all-attention")


def _engine(args: argparse.Namespace, hybrid: bool) -> Any:
    from localchat.backends import RunnerOptions
    from localchat.backends.torch.runner import TorchRunner
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine

    runner = TorchRunner(_bundle(args, hybrid), RunnerOptions(device="cpu", dtype=args.dtype))

    class _Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return ""

    # No prefix caching for either: every round prefills the same prompt (hybrids never reuse prefixes).
    config = EngineConfig(
        kv_cache_mib=512, max_num_seqs=args.seqs, prefill_chunk_size=args.prompt, enable_prefix_caching=False
    )
    config.max_num_batched_tokens = max(config.max_num_batched_tokens, args.prompt)
    return LLMEngine(runner, _Tok(), config, eos_token_ids=[], model_max_len=4096)  # type: ignore[arg-type]


def _measure(args: argparse.Namespace, engine: Any) -> dict[str, float]:
    from localchat.engine.sampling_params import SamplingParams

    runner = engine.runner
    prompt = [(i * 7919) % 31_000 + 1 for i in range(args.prompt)]

    def generate(num: int, tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        for i in range(num):
            engine.add_request([t + i for t in prompt[:16]], params)
        while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
            engine.step()  # prefill the short prompts first
        start = time.perf_counter()
        while engine.has_unfinished:
            engine.step()
        return num * (tokens - 1) / (time.perf_counter() - start)

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.add_request(prompt[:32], params)  # warm-up
    while engine.has_unfinished:
        engine.step()
    engine.add_request(prompt, params)
    start = time.perf_counter()
    while engine.has_unfinished:
        engine.step()
    prefill = args.prompt / (time.perf_counter() - start)
    spec = runner.state_cache_spec
    return {
        "prefill_tok_s": prefill,
        "decode_1_tok_s": generate(1, args.decode),
        f"decode_{args.seqs}_tok_s": generate(args.seqs, args.decode),
        "state_bytes_per_seq": spec.bytes_per_slot if spec is not None else 0,
        "kv_bytes_per_token": runner.kv_cache_spec.bytes_per_block(1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engines = {
        "hybrid (3 of 4 layers DeltaNet)": _engine(args, True),
        "all full attention": _engine(args, False),
    }
    best: dict[str, dict[str, float]] = {name: {} for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            for key, value in _measure(args, engine).items():
                best[name][key] = max(best[name].get(key, 0.0), value)
    for name, result in best.items():
        print(name, {k: round(v, 1) for k, v in result.items()})


if __name__ == "__main__":
    main()
