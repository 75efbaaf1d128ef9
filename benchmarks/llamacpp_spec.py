"""llama.cpp's own plain, prompt-lookup and draft-model decoding on the same prompt, for spec_bench.py's
comparison table: `llama-completion` (plain), `llama-lookup` (n-gram) and `llama-speculative` (draft),
from a llama.cpp build's bin folder (cmake --build build --target llama-completion llama-lookup
llama-speculative; LLAMA_BUILD_EXAMPLES and LLAMA_BUILD_TOOLS on).

Each mode runs once per call, single stream, greedy (--temp 0), the given thread count for target and
draft, k draft tokens (--spec-draft-n-max) and the draft's p_min (--draft-p-min), polling off (--poll 0:
on a shared box, spinning threads that wait for a core cost more than they save). Decode tok/s is what
the tool reports for generation alone: "decoded N tokens in T seconds" (lookup, speculative), or the
eval line of the perf summary (completion).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODES = ("plain", "lookup", "draft")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_EVAL = re.compile(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


@dataclass(slots=True)
class LlamaCppRun:
    mode: str
    tokens: int
    seconds: float
    drafted: int = 0
    accepted: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def run_llamacpp(
    bin_dir: Path,
    mode: str,
    model: Path,
    prompt: str,
    tokens: int,
    *,
    draft_model: Path | None = None,
    k: int = 4,
    p_min: float = 0.75,
    threads: int = 2,
    timeout: float = 1800,
) -> LlamaCppRun:
    """One greedy generation of `tokens` tokens after `prompt` (already chat-templated text)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(prompt)
        prompt_file = handle.name
    common = ["-m", str(model), "-f", prompt_file, "-n", str(tokens), "--temp", "0", "--ignore-eos"]
    common += ["-t", str(threads), "-tb", str(threads), "-c", "4096", "--poll", "0"]
    if mode == "plain":
        command = [str(bin_dir / "llama-completion"), *common, "-no-cnv", "--no-display-prompt"]
    elif mode == "lookup":
        command = [str(bin_dir / "llama-lookup"), *common, "--spec-draft-n-max", str(k)]
    elif mode == "draft":
        if draft_model is None:
            raise ValueError("llama.cpp's draft mode needs a draft model")
        command = [str(bin_dir / "llama-speculative"), *common, "-md", str(draft_model)]
        command += ["-td", str(threads), "--spec-draft-n-max", str(k), "--draft-p-min", str(p_min)]
    else:
        raise ValueError(f"mode must be one of {MODES}")
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL
        )
    finally:
        Path(prompt_file).unlink(missing_ok=True)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {log[-2000:]}")
    return _parse(mode, log)


def _parse(mode: str, log: str) -> LlamaCppRun:
    if mode == "plain":
        found = _EVAL.findall(log)
        if not found:
            raise RuntimeError(f"no eval time in llama-completion's output: {log[-2000:]}")
        ms, runs = found[-1]
        return LlamaCppRun(mode, int(runs), float(ms) / 1000)
    decoded = _DECODED.search(log)
    if decoded is None:
        raise RuntimeError(f"no 'decoded N tokens' line in the output: {log[-2000:]}")
    drafted, accepted = _DRAFTED.search(log), _ACCEPTED.search(log)
    return LlamaCppRun(
        mode,
        int(decoded.group(1)),
        float(decoded.group(2)),
        int(drafted.group(1)) if drafted else 0,
        int(accepted.group(1)) if accepted else 0,
    )
