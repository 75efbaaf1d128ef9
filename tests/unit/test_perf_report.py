"""benchmarks/perf_report.py: engine_bench's JSON becomes one table per machine between the markers of
docs/performance.md, replacing only that machine's table."""

from __future__ import annotations

from benchmarks.perf_report import (
    BEGIN,
    DOC,
    END,
    Machine,
    machine_table,
    median_result,
    replace_machine,
    this_machine,
)

RESULT = {
    "model": "m.gguf",
    "backend": "torch",
    "device": "cpu (bfloat16)",
    "threads": None,
    "load_s": 0.5,
    "prompt_tokens": 480,
    "prefill_tok_s": 800.0,
    "decode_tokens": 256,
    "decode_tok_s": 120.0,
    "batch_tokens": 2048,
    "batch_tok_s": 300.0,
    "peak_rss_mib": 400.0,
}
ZEN = Machine("AMD EPYC", "avx512vnni + bf16", 2)
OTHER = Machine("Apple M2", "neon", 8)


def _doc(*tables: str) -> str:
    return "# Performance\n\nMethod.\n\n" + BEGIN + "\n" + "\n".join(tables) + END + "\n\n## Older\n"


def test_the_table_names_the_machine_and_every_number() -> None:
    table = machine_table(ZEN, RESULT, 3, "2026-11-29", "Busy box.")
    assert "### AMD EPYC, avx512vnni + bf16, 2 cores" in table
    assert "median of 3 run(s)" in table and "Busy box." in table
    assert "| prefill, 480-token chat prompt | 800 tok/s |" in table
    assert "| decode, single stream (256 tokens) | 120.0 tok/s |" in table
    assert "| 16 requests, aggregate (2048 tokens) | 300.0 tok/s |" in table
    assert "TTFT" not in table  # no such number in this result: no row


def test_a_machine_replaces_only_its_own_table() -> None:
    old_zen = machine_table(ZEN, {**RESULT, "decode_tok_s": 1.0}, 1, "2026-01-01", "")
    mac = machine_table(OTHER, RESULT, 1, "2026-01-01", "")
    new_zen = machine_table(ZEN, RESULT, 1, "2026-11-29", "")
    doc = replace_machine(_doc(old_zen, mac), ZEN, new_zen)
    assert doc.count("### AMD EPYC") == 1 and "| 1.0 tok/s |" not in doc and "2026-11-29" in doc
    assert "### Apple M2, neon, 8 cores" in doc and doc.endswith(END + "\n\n## Older\n")
    assert replace_machine(doc, ZEN, new_zen) == doc  # regenerating the same numbers changes nothing
    added = replace_machine(_doc(), OTHER, mac)
    assert added.count("### Apple M2") == 1


def test_numbers_are_medians_over_runs() -> None:
    runs = [{**RESULT, "decode_tok_s": v, "threads": None} for v in (100.0, 140.0, 120.0)]
    merged = median_result(runs)
    assert merged["decode_tok_s"] == 120.0 and merged["model"] == "m.gguf" and merged["threads"] is None


def test_this_machine_and_the_doc_have_what_the_report_needs() -> None:
    machine = this_machine()
    assert machine.cpu and machine.isa and machine.cores >= 1
    text = DOC.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
