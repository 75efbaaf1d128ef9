"""Micro-batch overlap under `--pp 2` (gloo, CPU): one prefill step of 4 prompts x 256 tokens through a
random Llama-shaped model (hidden 1024, 8 layers, no download), whole vs cut into 2 groups of rows
(parallel/micro_batches.py), so stage 1 runs group 1 while stage 0 runs group 2. Ideal: 3/4 of the
whole step's time (2 stages, 2 groups). One thread per rank.

    python -m benchmarks.pp_micro_bench --repeats 5
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    whole = prefill_seconds(False, args.repeats)
    cut = prefill_seconds(True, args.repeats)
    print(f"PP=2 gloo, {PROMPTS} x {TOKENS}-token prefill, median of {args.repeats}:")
    print(f"  whole step: {statistics.median(whole):.3f} s  (all: {', '.join(f'{t:.3f}' for t in whole)})")
    print(f"  2 groups:   {statistics.median(cut):.3f} s  (all: {', '.join(f'{t:.3f}' for t in cut)})")
    print(f"  ratio: {statistics.median(cut) / statistics.median(whole):.2f} (ideal 0.75)")


if __name__ == "__main__":
    main()
