"""Micro-batch overlap under `--pp 2` (gloo, CPU): one prefill step of 4 prompts x 256 tokens through a
random Llama-shaped model (hidden 1024, 8 layers, no download), whole vs cut into 2 groups of rows
(parallel/micro_batches.py), so stage 1 runs group 1 while stage 0 runs group 2. Ideal: 3/4 of the
whole step's time (2 stages, 2 groups). One thread per rank.

`--decode 8,16`: decode throughput instead, with 8 and then 16 streams (32-token prompts, greedy):
one step at a time vs two steps in flight (the engine's StepsInFlight, a group per stage), alternated
on the same ranks (only rank 0's engine changes), tokens/s after every stream has its first token.

    python -m benchmarks.pp_micro_bench --repeats 5
    python -m benchmarks.pp_micro_bench --decode 8,16 --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_bench import SilentTokenizer, random_weights

CONFIG: dict[str, object] = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 4096,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PROMPTS, TOKENS = 4, 256


def load(cut: bool) -> object:
    """The model (every rank builds it), and whether this rank cuts large steps (all ranks alike)."""
    from localchat.backends.torch.parallel.pipeline import PipelineStageRunner
    from localchat.weights.bundle import ModelBundle
    from localchat.weights.config import ModelConfig

    PipelineStageRunner.micro_batch_tokens = 256 if cut else 10**9
    return ModelBundle(
        "pp-micro",
        Path("pp-micro"),
        "gguf",
        ModelConfig.from_hf_dict(CONFIG),
        lambda: random_weights(CONFIG, "bf16"),  # type: ignore[arg-type,return-value]
        tokenizer=None,  # type: ignore[arg-type]
    )


def prefill_seconds(cut: bool, repeats: int) -> list[float]:
    from localchat.backends import RunnerOptions
    from localchat.backends.torch.parallel.driver import ParallelRunner
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams

    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, pipeline_parallel_size=2)
    runner = ParallelRunner(load(cut), options, load=functools.partial(load, cut))  # type: ignore[arg-type]
    config = EngineConfig(
        max_num_seqs=PROMPTS,
        max_num_batched_tokens=PROMPTS * TOKENS,
        kv_cache_mib=256,
        enable_prefix_caching=False,
    )
    engine = LLMEngine(runner, SilentTokenizer(), config, eos_token_ids=[2], model_max_len=4096)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    try:
        for repeat in range(repeats + 1):  # the first is a warm-up
            for p in range(PROMPTS):
                engine.add_request([10 + repeat + p + i % 97 for i in range(TOKENS)], params)
            start = time.perf_counter()
            while engine.has_unfinished:
                engine.step()
            if repeat:
                times.append(time.perf_counter() - start)
    finally:
        runner.shutdown()
    return times


def decode_rates(streams: int, steps: int, depth: int, runner: object, prompt: int = 32) -> float:
    """Tokens/s of `streams` greedy decodes on `runner` (PP=2 ranks), `depth` steps in flight."""
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams

    runner.steps_in_flight = depth  # type: ignore[attr-defined]
    config = EngineConfig(max_num_seqs=streams, max_num_batched_tokens=2048, kv_cache_mib=256)
    engine = LLMEngine(runner, SilentTokenizer(), config, eos_token_ids=[2], model_max_len=4096)  # type: ignore[arg-type]
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    for p in range(streams):
        engine.add_request([10 + 7 * p + i % 97 for i in range(prompt)], params)
    started: set[str] = set()
    start, tokens = 0.0, 0
    while engine.has_unfinished:
        for out in engine.step():
            if out.req_id in started:
                tokens += len(out.new_token_ids)
            started.add(out.req_id)
        if not start and len(started) == streams:
            start = time.perf_counter()
    return tokens / (time.perf_counter() - start)


def decode(streams_list: list[int], repeats: int, steps: int, prompt: int) -> None:
    from localchat.backends import RunnerOptions
    from localchat.backends.torch.parallel.driver import ParallelRunner

    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, pipeline_parallel_size=2)
    runner = ParallelRunner(load(True), options, load=functools.partial(load, True))  # type: ignore[arg-type]
    try:
        decode_rates(streams_list[0], 4, 2, runner)  # warm-up
        for streams in streams_list:
            rates: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(repeats):
                for depth in (1, 2):  # alternated
                    rates[depth].append(decode_rates(streams, steps, depth, runner, prompt))
            one, two = statistics.median(rates[1]), statistics.median(rates[2])
            load_avg = Path("/proc/loadavg").read_text().split()[:3]
            print(
                f"PP=2 gloo, {streams} streams x {steps} tokens after {prompt}, median of {repeats} (load {' '.join(load_avg)}):"
            )
            print(f"  one step at a time: {one:7.1f} tok/s  (all: {', '.join(f'{r:.1f}' for r in rates[1])})")
            print(f"  2 steps in flight:  {two:7.1f} tok/s  (all: {', '.join(f'{r:.1f}' for r in rates[2])})")
            print(f"  ratio: {two / one:.2f}")
    finally:
        runner.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode", help="decode throughput for these stream counts, e.g. 8,16")
    parser.add_argument("--steps", type=int, default=32, help="decode tokens per stream (--decode)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per stream (--decode)")
    args = parser.parse_args()
    if args.decode:
        decode([int(n) for n in args.decode.split(",")], args.repeats, args.steps, args.prompt)
        return
    whole = prefill_seconds(False, args.repeats)
    cut = prefill_seconds(True, args.repeats)
    print(f"PP=2 gloo, {PROMPTS} x {TOKENS}-token prefill, median of {args.repeats}:")
    print(f"  whole step: {statistics.median(whole):.3f} s  (all: {', '.join(f'{t:.3f}' for t in whole)})")
    print(f"  2 groups:   {statistics.median(cut):.3f} s  (all: {', '.join(f'{t:.3f}' for t in cut)})")
    print(f"  ratio: {statistics.median(cut) / statistics.median(whole):.2f} (ideal 0.75)")


if __name__ == "__main__":
    main()
