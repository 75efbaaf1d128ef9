"""Engine-only benchmark (no HTTP): single-stream prefill/decode, 16-request aggregate, TTFT, peak RSS.

python benchmarks/engine_bench.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf [--backend torch]

`--compare-cpu-attention N`: instead, N alternating rounds of single-stream decode with the fused C
decode-attention kernel and with `LOCALCHAT_TORCH_ATTENTION=torch` (flipped in the runner's resolved copy,
which each step reads, so one process and one loaded model serve both): median tok/s of each and their ratio.

`--compare-kv-dtype N`: two engines on the same file in one process, `--kv-cache-dtype auto` and
`int8`, N alternating rounds of single-stream decode and the 16-request run: median tok/s of each, their
ratio, and KV MiB per 1k tokens and blocks in `--mem`.

`--json`: one JSON object instead of the table (machine-readable numbers; benchmarks/perf_report.py
reads it).

`--speculative ngram [--num-speculative-tokens K]`: speculative decoding with n-gram lookup
(docs/speculative.md); adds the drafted tokens, accepted share and tokens per target pass of the
single stream and of the 16-request run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import CONCURRENT_PROMPTS, long_chat_messages
from localchat import LLM, SamplingParams
from localchat.engine.config import EngineConfig
from localchat.engine.outputs import RequestOutput
from localchat.engine.speculative import SpeculativeConfig


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float | None:
    """Resident now (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def single_stream(llm: LLM, new_tokens: int) -> tuple[int, float, float, RequestOutput]:
    """Returns (prompt tokens, prefill tok/s, decode tok/s, its final output) for one request, ignoring
    EOS."""
    ids = llm.apply_chat_template(long_chat_messages())
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    engine.add_request(ids, params)
    start = time.perf_counter()
    first = None
    last: RequestOutput | None = None
    while engine.has_unfinished:
        outs = engine.step()
        if first is None and any(o.new_token_ids for o in outs):
            first = time.perf_counter()
        last = next((o for o in outs if o.finished), last)
    end = time.perf_counter()
    assert first is not None and last is not None
    return len(ids), len(ids) / (first - start), (new_tokens - 1) / (end - first), last


def speculation_cell(drafted: int, accepted: int, tokens: int, passes: int) -> str:
    share = accepted / drafted if drafted else 0.0
    per_pass = tokens / passes if passes else 0.0
    return f"{drafted} drafted, {share:.0%} accepted, {per_pass:.2f} tokens/pass"


def concurrent(llm: LLM, max_tokens: int) -> tuple[int, float, float, float]:
    """16 chat requests at once. Returns (output tokens, tok/s, TTFT p50 s, TTFT max s)."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    start = time.perf_counter()
    ids = [
        engine.add_request(llm.apply_chat_template([{"role": "user", "content": p}]), params)
        for p in CONCURRENT_PROMPTS
    ]
    ttft: dict[str, float] = {}
    tokens = 0
    while engine.has_unfinished:
        for out in engine.step():
            tokens += len(out.new_token_ids)
            if out.new_token_ids and out.req_id not in ttft:
                ttft[out.req_id] = time.perf_counter() - start
    elapsed = time.perf_counter() - start
    firsts = sorted(ttft[i] for i in ids)
    return tokens, tokens / elapsed, firsts[len(firsts) // 2], firsts[-1]


def compare_cpu_attention(llm: LLM, new_tokens: int, rounds: int) -> None:
    import statistics

    results: dict[str, list[float]] = {"fused C kernel": [], "torch (gather + bmm)": []}
    settings: dict[str, str] = cast(Any, llm.runner).backend_settings  # the torch runner's copy
    chosen = settings["LOCALCHAT_TORCH_ATTENTION"]
    for _ in range(rounds):
        for name in results:  # alternate so that load on the box hits both alike
            settings["LOCALCHAT_TORCH_ATTENTION"] = "torch" if name.startswith("torch") else "auto"
            llm.engine.block_manager.reset_prefix_cache()
            results[name].append(single_stream(llm, new_tokens)[2])
    settings["LOCALCHAT_TORCH_ATTENTION"] = chosen
    fused, plain = (statistics.median(v) for v in results.values())
    print(f"| CPU decode attention | single-stream decode tok/s, median of {rounds} (all rounds) |")
    print("|---|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)}) |")
    print(f"| fused / torch | {fused / plain:.2f} |")


def compare_kv_dtype(model: str, args: argparse.Namespace, rounds: int) -> None:
    import statistics

    llms = {
        kv: LLM(model, backend=args.backend, device=args.device, dtype=args.dtype,
                engine_config=EngineConfig(kv_cache_mib=args.mem), kv_cache_dtype=kv)
        for kv in ("auto", "int8")
    }  # fmt: skip
    single: dict[str, list[float]] = {kv: [] for kv in llms}
    many: dict[str, list[float]] = {kv: [] for kv in llms}
    for llm in llms.values():
        llm.generate("Warm up.", SamplingParams(temperature=0, max_tokens=8))
    for _ in range(rounds):
        for kv, llm in llms.items():  # alternate so that load on the box hits both alike
            llm.engine.block_manager.reset_prefix_cache()
            single[kv].append(single_stream(llm, args.decode_tokens)[2])
            llm.engine.block_manager.reset_prefix_cache()
            many[kv].append(concurrent(llm, args.max_tokens)[1])

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})"

    def kv_cells(llm: LLM) -> tuple[str, str]:
        spec = llm.runner.kv_cache_spec
        per_1k = spec.bytes_per_block(1000) / 2**20
        return f"{per_1k:.1f}", str(llm.engine.block_manager.num_usable_blocks)

    print(f"{llms['auto'].runner.device_name}; medians of {rounds} alternating rounds (each round)")
    print(
        f"| KV cache | single-stream decode tok/s | 16 requests tok/s | KV MiB / 1k tokens | blocks in {args.mem} MiB |"
    )
    print("|---|---|---|---|---|")
    for kv, llm in llms.items():
        name = kv if kv == "int8" else f"auto ({llm.runner.kv_cache_spec.dtype_name})"
        print(f"| {name} | {cell(single[kv])} | {cell(many[kv])} | {' | '.join(kv_cells(llm))} |")
    ratio = [statistics.median(d["int8"]) / statistics.median(d["auto"]) for d in (single, many)]
    mem = llms["int8"].runner.kv_cache_spec.bytes_per_block(16) / llms[
        "auto"
    ].runner.kv_cache_spec.bytes_per_block(16)
    print(f"| int8 / auto | {ratio[0]:.2f} | {ratio[1]:.2f} | {mem:.2f} | {1 / mem:.2f} |")


def speculative_row(llm: LLM, args: argparse.Namespace) -> str:
    if args.speculative == "off":
        return "off"
    note = llm.engine.speculation_note
    return f"off: {note}" if note else f"{args.speculative}, k={args.num_speculative_tokens}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128, help="per request in the 16-request run")
    parser.add_argument("--mem", type=int, default=1024, help="KV cache MiB")
    parser.add_argument("--threads", type=int, help="CPU compute threads (default: the backend's choice)")
    parser.add_argument(
        "--single-only", action="store_true", help="skip the 16-request run (8B-size models on small CPUs)"
    )
    parser.add_argument("--compare-cpu-attention", type=int, metavar="ROUNDS", help="see the docstring")
    parser.add_argument("--compare-kv-dtype", type=int, metavar="ROUNDS", help="see the docstring")
    parser.add_argument("--speculative", choices=["off", "ngram"], default="off", help="see the docstring")
    parser.add_argument("--num-speculative-tokens", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--json", action="store_true", help="print one JSON object, not the table")
    args = parser.parse_args()
    if args.threads:
        # Read by the backends when they size their thread pools (before any of them is imported).
        os.environ["OMP_NUM_THREADS"] = str(args.threads)

    if args.compare_kv_dtype:
        compare_kv_dtype(args.model, args, args.compare_kv_dtype)
        return
    t0 = time.perf_counter()
    llm = LLM(
        args.model,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        engine_config=EngineConfig(
            kv_cache_mib=args.mem,
            speculative=SpeculativeConfig(args.speculative, args.num_speculative_tokens),
        ),
    )
    load_s = time.perf_counter() - t0
    llm.generate("Warm up.", SamplingParams(temperature=0, max_tokens=8))  # first-call allocations

    if args.compare_cpu_attention:
        compare_cpu_attention(llm, args.decode_tokens, args.compare_cpu_attention)
        return
    loaded_rss = current_rss_mib()
    prompt_len, prefill, decode, out = single_stream(llm, args.decode_tokens)
    llm.engine.block_manager.reset_prefix_cache()
    spec_rows = []
    if args.speculative != "off":
        counts = (
            out.spec_draft_tokens,
            out.spec_accepted_tokens,
            out.num_output_tokens,
            out.num_target_passes,
        )
        spec_rows = [("speculation, single stream", speculation_cell(*counts))]
    batch_rows = []
    numbers: dict[str, float | int | None] = {}
    if not args.single_only:
        before = llm.engine.stats()
        tokens, agg, ttft_p50, ttft_max = concurrent(llm, args.max_tokens)
        after = llm.engine.stats()
        numbers |= {
            "batch_requests": 16,
            "batch_tokens": tokens,
            "batch_tok_s": agg,
            "batch_ttft_p50_ms": ttft_p50 * 1000,
            "batch_ttft_max_ms": ttft_max * 1000,
        }
        batch_rows = [
            (f"16 requests, aggregate ({tokens} tokens)", f"{agg:.1f} tok/s"),
            ("16 requests, TTFT p50 / max", f"{ttft_p50 * 1000:.0f} / {ttft_max * 1000:.0f} ms"),
        ]
        if args.speculative != "off":  # this run's share of the engine's totals
            cell = speculation_cell(
                after.spec_draft_tokens_total - before.spec_draft_tokens_total,
                after.spec_accepted_tokens_total - before.spec_accepted_tokens_total,
                after.generation_tokens_total - before.generation_tokens_total,
                after.sequence_passes_total - before.sequence_passes_total,
            )
            spec_rows.append(("speculation, 16 requests", cell))

    device = llm.runner.device_name
    if args.json:
        result = {
            "model": Path(args.model).name,
            "backend": args.backend,
            "device": device,
            "threads": args.threads,
            "speculative": speculative_row(llm, args),
            "load_s": load_s,
            "prompt_tokens": prompt_len,
            "prefill_tok_s": prefill,
            "decode_tokens": args.decode_tokens,
            "decode_tok_s": decode,
            **numbers,
            "rss_after_load_mib": loaded_rss,
            "peak_rss_mib": peak_rss_mib(),
        }
        print(json.dumps(result))
        return
    rows = [
        ("model", Path(args.model).name),
        ("backend / device", f"{args.backend} / {device}"),
        ("threads", str(args.threads or "backend default")),
        ("speculative", speculative_row(llm, args)),
        ("load time", f"{load_s:.1f} s"),
        (f"prefill ({prompt_len}-token chat prompt)", f"{prefill:.0f} tok/s"),
        (f"decode, single stream ({args.decode_tokens} tokens)", f"{decode:.1f} tok/s"),
        *batch_rows,
        *spec_rows,
        ("RSS after load and warm-up", "n/a" if loaded_rss is None else f"{loaded_rss:.0f} MiB"),
        ("peak RSS", f"{peak_rss_mib():.0f} MiB"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"| {'metric'.ljust(width)} | value |\n|{'-' * (width + 2)}|-------|")
    for key, value in rows:
        print(f"| {key.ljust(width)} | {value} |")


if __name__ == "__main__":
    main()
