"""Speculative decoding on a hybrid model (engine/hybrid_spec.py): what verify steps with per-position
recurrent states cost and gain, on a real GGUF (e.g. the random-weight Qwen3.5-2B-shaped file of
docs/hybrid.md, made by benchmarks/make_hybrid_gguf.py).

Random weights never copy their context, so n-gram lookup keeps almost nothing there. To see what the
verify steps themselves cost and pay, two more proposers replay the model's own plain greedy output for
the prompt: `oracle` drafts exactly it (every draft kept), `half` drafts it with the third draft wrong
(2 of 4 kept per step, so every step copies a spec row back). Plain, n-gram, oracle and half runs
alternate round by round (one stream, greedy); each reports decode tok/s, drafts kept, tokens per target
pass and whether the output equals plain's.

Then the per-step cost of writing the per-position states: one gated DeltaNet layer's C step over a
5-token row (the last token and 4 drafts) with its states kept after each of the first 4 positions
(`state_keep`), against the same row as a plain 5-token chunk and against a one-token decode row,
alternating, medians over --reps calls.

OMP_NUM_THREADS=2 python benchmarks/hybrid_spec_bench.py --model /tmp/hyb/qwen35-2b-random-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.stream_timing import run_timed
from localchat import LLM, SamplingParams
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.request import Request
from localchat.engine.speculative import SpeculativeConfig

PROMPT = "Repeat this list exactly, then continue it: " + ", ".join(["alpha beta gamma delta"] * 12)


class ReplayProposer:
    """Drafts the plain run's output from the sequence's position on; `wrong_at`: that draft is wrong."""

    def __init__(self, plain: list[int], wrong_at: int | None, vocab: int) -> None:
        self.plain, self.wrong_at, self.vocab = plain, wrong_at, vocab

    def propose(self, wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for request, k in wanted:
            n = request.num_output_tokens
            drafts = list(self.plain[n : n + k])
            if self.wrong_at is not None and len(drafts) > self.wrong_at:
                drafts[self.wrong_at] = (drafts[self.wrong_at] + 1) % self.vocab
            out[request.req_id] = drafts
        return out


def decode(engine: LLMEngine, ids: list[int], tokens: int) -> tuple[list[int], float]:
    engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    return run_timed(engine)


def layer_cost(llm: LLM, reps: int) -> None:
    import torch

    from localchat.backends.torch.state_cache import StateCache, StepRows

    model = llm.runner.model  # type: ignore[attr-defined]
    layer = next(layer for layer in model.hybrid_layers if layer.linear)
    dtype = model.norm.dtype
    cache = StateCache([layer.state_shape()], 6, dtype, lambda shape, dt: torch.zeros(shape, dtype=dt))
    hidden = model.norm.shape[0]
    x = torch.randn(5, hidden).to(dtype) * 0.1
    cpu = torch.device("cpu")
    pos = np.arange(10, 15, dtype=np.int64)
    keep = np.array([1, 2, 3, 4, -1], dtype=np.int64)
    qsl = np.array([0, 5], dtype=np.int64)
    slot = np.array([0], dtype=np.int64)
    cases = {
        "5-token row, states kept": (x, StepRows.from_batch(slot, qsl, pos, cpu, keep), (qsl, slot)),
        "5-token chunk": (x, StepRows.from_batch(slot, qsl, pos, cpu), (qsl, slot)),
        "1-token decode": (
            x[:1],
            StepRows.from_batch(slot, np.array([0, 1]), pos[:1], cpu),
            (np.array([0, 1]), slot),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.inference_mode():
        for _ in range(reps):
            for name, (xs, rows, (starts, slots)) in cases.items():
                spans = (torch.from_numpy(starts.astype(np.int64)), torch.from_numpy(slots))
                t0 = time.perf_counter()
                layer.linear_attention(xs, rows, cache, 0, spans)
                times[name].append(time.perf_counter() - t0)
    layers = len(model.linear_layers)
    print(f"\none gated DeltaNet layer (in_proj, C step, out_proj), median of {reps}; x {layers} layers:")
    for name, values in times.items():
        ms = statistics.median(values) * 1e3
        print(f"  {name:<26} {ms:6.2f} ms   x{layers}: {ms * layers:6.1f} ms")
    per_slot = layer.state_shape().bytes_per_slot(dtype)
    print(
        f"  states kept per verify step: 4 x {per_slot / 2**20:.2f} MiB per layer, {4 * per_slot * layers / 2**20:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--kv-mib", type=int, default=640)
    parser.add_argument("--modes", nargs="+", default=["ngram", "oracle", "half"])
    args = parser.parse_args()
    llm = LLM(args.model, backend="torch", engine_config=EngineConfig(kv_cache_mib=args.kv_mib))
    ids = llm.apply_chat_template([{"role": "user", "content": PROMPT}])
    vocab = llm.model.config.vocab_size

    def engine(method: str) -> LLMEngine:
        spec = SpeculativeConfig(method, num_tokens=args.k) if method != "off" else SpeculativeConfig()
        return LLMEngine(
            llm.runner,
            llm.tokenizer,
            EngineConfig(
                kv_cache_mib=args.kv_mib, speculative=spec, enable_prefix_caching=False, max_num_seqs=4
            ),
            eos_token_ids=[],
            model_max_len=4096,
        )

    plain = engine("off")  # first: the engines share the runner, and the last one sizes its state pool
    reference, _ = decode(plain, ids, args.tokens)
    engines = {mode: engine("ngram") for mode in args.modes}
    for mode, eng in engines.items():
        if mode != "ngram":
            eng.scheduler.proposer = ReplayProposer(reference, None if mode == "oracle" else 2, vocab)
    rates: dict[str, list[float]] = {m: [] for m in ["off", *engines]}
    same: dict[str, bool] = {m: True for m in engines}
    loads = []
    for _ in range(args.rounds):
        loads.append(Path("/proc/loadavg").read_text().split()[0])
        out, rate = decode(plain, ids, args.tokens)
        rates["off"].append(rate)
        for mode, eng in engines.items():
            got, rate = decode(eng, ids, args.tokens)
            rates[mode].append(rate)
            same[mode] &= got == out
    base = statistics.median(rates["off"])
    print(f"prompt {len(ids)} tokens, {args.tokens} generated, k {args.k}, loads {', '.join(loads)}")
    print(f"{'mode':<7} {'tok/s':>6} {'vs plain':>8} {'kept':>6} {'tok/pass':>8} {'fix-ups':>7} same")
    print(f"{'off':<7} {base:6.1f}")
    for mode, eng in engines.items():
        stats, rows = eng.stats(), eng.scheduler.spec_rows
        rate = statistics.median(rates[mode])
        print(
            f"{mode:<7} {rate:6.1f} {rate / base:7.2f}x {stats.spec_acceptance_rate:6.0%} "
            f"{stats.tokens_per_target_pass:8.2f} {rows.fixups_total if rows else 0:7d} {'yes' if same[mode] else 'NO'}"
        )
    layer_cost(llm, args.reps)


if __name__ == "__main__":
    main()
