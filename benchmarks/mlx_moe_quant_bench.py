"""MLX MoE expert stacks: resident size and one-token decode time of a tiny-but-wide random Qwen3-MoE GGUF
per weight type, for two checkouts of localchat (e.g. before / after a change), alternated.

python benchmarks/mlx_moe_quant_bench.py --types NVFP4 MXFP4 Q4_K --before /tmp/old-localchat-root

Each measurement is a fresh process (so resident sizes do not mix): it loads the file with `load_model` and
the MLX runner (float32 on MLX's CPU device, as `--dtype auto` picks there), reports the resident set
growth of the load (VmRSS after minus before), the peak (VmHWM), the bytes MLX holds (mx.get_active_memory)
and the expert stacks' form, then times `--steps` one-token decode steps of one sequence after an 8-token
prefill (median ms). `--before` names a directory holding another `localchat` package (git archive of an
older commit); without it only the working tree is measured. The GGUFs are written once into `--dir`
(random weights through tests/helpers/tiny_gguf.py's encoders; values do not change speed or size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = {
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "intermediate_size": 512,
    "norm_topk_prob": True,
}


def write(path: Path, qtype: str) -> None:
    """A random Qwen3-MoE in transformers 5's names (stacked experts), written as llama.cpp would."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, random_state_dict, tiny_config, write_tiny_gguf

    cfg = tiny_config("qwen3_moe", vocab_size=TINY_VOCAB_SIZE, **SHAPE)
    state = {k: v for k, v in random_state_dict(cfg).items() if ".mlp." not in k}
    rng = np.random.default_rng(1)
    hidden, experts, inter, head_dim = (
        SHAPE["hidden_size"],
        SHAPE["num_experts"],
        SHAPE["moe_intermediate_size"],
        64,
    )
    for i in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_norm.weight"] = np.ones(head_dim, dtype=np.float32)
        state[p + "self_attn.k_norm.weight"] = np.ones(head_dim, dtype=np.float32)
        state[p + "mlp.gate.weight"] = (0.02 * rng.standard_normal((experts, hidden))).astype(np.float32)
        state[p + "mlp.experts.gate_up_proj"] = (
            0.02 * rng.standard_normal((experts, 2 * inter, hidden))
        ).astype(np.float32)
        state[p + "mlp.experts.down_proj"] = (0.02 * rng.standard_normal((experts, hidden, inter))).astype(
            np.float32
        )
    write_tiny_gguf(path, state, cfg, qtype=qtype)


def rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def measure(path: Path, steps: int) -> dict[str, object]:
    """In the child: load, size, decode (the parent set sys.path so `localchat` is the checkout's)."""
    import mlx.core as mx

    from localchat.backends import RunnerOptions
    from localchat.backends.mlx.runner import MLXRunner
    from localchat.weights.loader import load_model
    from tests.helpers.torch_batch import PagedDriver

    before = rss_kib()
    start = time.perf_counter()
    runner = MLXRunner(load_model(path), RunnerOptions(device="cpu", dtype="auto", seed=0))
    load_s = time.perf_counter() - start
    grown = rss_kib() - before
    moe = runner.model.layers[0].moe
    form = type(moe.gate_up).__name__ + "/" + str(getattr(moe.gate_up, "mode", "dense"))
    driver = PagedDriver(runner, num_blocks=64, block_size=16)
    driver.add("a", [5, 17, 99, 3, 250, 42, 7, 81])
    driver.step()  # the prefill
    for _ in range(3):
        driver.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        driver.step()
        times.append((time.perf_counter() - t) * 1000)
    return {
        "rss_growth_mib": grown / 1024,
        "peak_rss_mib": rss_kib("VmHWM") / 1024,
        "mlx_active_mib": mx.get_active_memory() / 2**20,
        "stack": form,
        "load_s": load_s,
        "decode_ms": statistics.median(times),
    }


def run_child(root: Path, path: Path, steps: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}
    code = (
        f"import sys; sys.path[:0] = [{str(root)!r}, {str(ROOT)!r}]; import json; "
        f"from benchmarks.mlx_moe_quant_bench import measure; "
        f"print('RESULT', json.dumps(measure(__import__('pathlib').Path({str(path)!r}), {steps})))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=str(root))
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, object] = json.loads(line[7:])
            return result
    raise RuntimeError(out.stderr[-3000:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--types", nargs="+", default=["NVFP4", "MXFP4", "Q4_K"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/mlx_moe_bench"))
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-only", action="store_true")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    for qtype in args.types:
        path = args.dir / f"moe-{qtype}.gguf"
        if not path.exists():
            write(path, qtype)
        print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB on disk", flush=True)
    if args.write_only:
        return
    trees = [("after", ROOT)] + ([("before", args.before)] if args.before else [])
    print(f"shape {SHAPE}; float32 on MLX's CPU device; load {Path('/proc/loadavg').read_text().split()[:3]}")
    print(
        "| type | tree | expert stack | RSS growth (MiB) | peak RSS (MiB) | MLX active (MiB) | decode (ms/token) |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    for qtype in args.types:
        path = args.dir / f"moe-{qtype}.gguf"
        results: dict[str, list[dict[str, object]]] = {name: [] for name, _ in trees}
        for _ in range(args.rounds):  # alternated: the box's load hits both alike
            for name, root in trees:
                results[name].append(run_child(root, path, args.steps))
        for name, _ in trees:
            rows = results[name]
            decode = statistics.median(float(r["decode_ms"]) for r in rows)  # type: ignore[arg-type]
            r = rows[-1]
            print(
                f"| {qtype} | {name} | {r['stack']} | {r['rss_growth_mib']:.0f} | {r['peak_rss_mib']:.0f} | "
                f"{r['mlx_active_mib']:.0f} | {decode:.2f} |",
                flush=True,
            )
    print(f"load after: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
