"""docs/performance.md's "current table per machine", regenerated from benchmark output, never hand-edited.

python benchmarks/perf_report.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf [--runs 3] [--note TEXT]

Runs `benchmarks/engine_bench.py --json` `--runs` times on this machine (or reads saved outputs with
`--from-json FILE ...`), takes the median of each number, names the machine (CPU model, the kernels'
ISA, logical cores) and writes its table between the report markers in docs/performance.md. Each machine
keeps one table, keyed by that name: a run on another machine adds its own and leaves this one alone.
`--print` shows the section instead of writing it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from localchat.cpu_features import best_isa, host_flags, native_bf16, runnable_isas  # noqa: E402

DOC = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- perf-report:begin -->", "<!-- perf-report:end -->"
MACHINE_MARK = "<!-- perf-report:machine "  # + the machine's name + " -->": where its table starts

# (engine_bench --json key, row label, format); rows whose key is missing are left out.
ROWS = [
    ("prefill_tok_s", "prefill, {prompt_tokens}-token chat prompt", "{:.0f} tok/s"),
    ("decode_tok_s", "decode, single stream ({decode_tokens} tokens)", "{:.1f} tok/s"),
    ("batch_tok_s", "16 requests, aggregate ({batch_tokens} tokens)", "{:.1f} tok/s"),
    ("batch_ttft_p50_ms", "16 requests, TTFT p50", "{:.0f} ms"),
    ("batch_ttft_max_ms", "16 requests, TTFT max", "{:.0f} ms"),
    ("load_s", "load time", "{:.1f} s"),
    ("rss_after_load_mib", "RSS after load and warm-up", "{:.0f} MiB"),
    ("peak_rss_mib", "peak RSS", "{:.0f} MiB"),
]


@dataclass(frozen=True)
class Machine:
    cpu: str
    isa: str  # the kernels' ISA (LOCALCHAT_KERNELS=auto's pick) and whether bf16 is native
    cores: int  # logical CPUs the OS reports

    @property
    def name(self) -> str:
        return f"{self.cpu}, {self.isa}, {self.cores} cores"


def this_machine() -> Machine:
    flags = host_flags()
    isa = best_isa(runnable_isas(flags)) + (" + bf16" if native_bf16(flags) else "")
    return Machine(cpu_model(), isa, os.cpu_count() or 1)


def cpu_model() -> str:
    """/proc/cpuinfo's model name (x86) or the platform's word for the processor elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def run_engine_bench(model: str, threads: int | None) -> dict[str, Any]:
    cmd = [sys.executable, str(REPO / "benchmarks" / "engine_bench.py"), "--model", model, "--json"]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # the JSON object is the last line printed


def median_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number's median over the runs; the other fields from the first run."""
    merged = dict(results[0])
    for key, value in results[0].items():
        values = [r[key] for r in results if isinstance(r.get(key), int | float)]
        if isinstance(value, int | float) and not isinstance(value, bool) and len(values) == len(results):
            merged[key] = statistics.median(values)
    return merged


def machine_table(machine: Machine, result: dict[str, Any], runs: int, when: str, note: str) -> str:
    lines = [
        f"{MACHINE_MARK}{machine.name} -->",
        f"### {machine.name}",
        "",
        f"`{result['model']}`, backend {result['backend']} ({result['device']}), threads "
        f"{result.get('threads') or 'backend default'}; median of {runs} run(s) of `engine_bench.py --json`, {when}."
        + (f" {note}" if note else ""),
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key, label, fmt in ROWS:
        if result.get(key) is not None:
            lines.append(f"| {label.format(**result)} | {fmt.format(result[key])} |")
    return "\n".join(lines) + "\n"


def replace_machine(doc: str, machine: Machine, table: str) -> str:
    """`doc` with `machine`'s table between the report markers replaced (or added after the others)."""
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC.name} has no {BEGIN} ... {END} section to write into")
    head, rest = doc.split(BEGIN, 1)
    section, tail = rest.split(END, 1)
    tables = [f"{MACHINE_MARK}{t}" for t in section.split(MACHINE_MARK)[1:]]
    kept = [t.strip() + "\n" for t in tables if not t.startswith(f"{MACHINE_MARK}{machine.name} -->")]
    body = "\n".join([*kept, table])
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="the GGUF or folder engine_bench runs")
    parser.add_argument("--runs", type=int, default=1, help="engine_bench runs; the table shows medians")
    parser.add_argument("--threads", type=int, help="passed to engine_bench")
    parser.add_argument("--from-json", nargs="+", type=Path, help="saved engine_bench --json outputs")
    parser.add_argument("--note", default="", help="conditions worth a sentence (e.g. a shared, busy box)")
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--print", action="store_true", help="print the table, write nothing")
    args = parser.parse_args()
    if args.from_json:
        results = [json.loads(p.read_text().strip().splitlines()[-1]) for p in args.from_json]
    elif args.model:
        results = [run_engine_bench(args.model, args.threads) for _ in range(args.runs)]
    else:
        parser.error("give --model (run the benchmark) or --from-json (read its output)")
    machine = this_machine()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    table = machine_table(machine, median_result(results), len(results), when, args.note)
    if args.print:
        print(table)
        return
    args.doc.write_text(replace_machine(args.doc.read_text(), machine, table))
    print(f"wrote the table for {machine.name} into {args.doc}")


if __name__ == "__main__":
    main()
