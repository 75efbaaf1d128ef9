"""Mixture-of-experts dispatch on CPU: the torch backend's batched dispatch (pairs sorted by expert, each
active expert once over its gathered rows; localchat/backends/torch/models/moe.py) against a naive loop
over tokens and their chosen experts, on one tiny MoE block (fp32, one thread). Both run in the same
process in alternating rounds; prints the median microseconds per block call and the ratio.
`--backend mlx`: the MLX block (stacked experts, `mx.gather_mm`) against the same per-token loop.
`--step`: whole decode steps of a small random Qwen3-MoE (4 layers, same block sizes) through the torch
runner, `--rows` sequences per step, with each dispatch swapped in.

python benchmarks/moe_bench.py [--backend torch|mlx] [--step] [--rows 1 4 16 64] [--experts 16] [--top-k 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    from localchat.arch.moe import MoeSpec
    from localchat.backends.torch.models.moe import SparseMoe

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backend", choices=["torch", "mlx"], default="torch")
    parser.add_argument("--step", action="store_true")
    args = parser.parse_args()
    if args.backend == "mlx":
        mlx_bench(args)
        return
    if args.step:
        step_bench(args)
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = MoeSpec(args.experts, args.top_k, True, args.size, frozenset({0}))
    moe = SparseMoe(spec, args.hidden)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(0.05 * torch.randn_like(p))

    def naive(x: torch.Tensor) -> torch.Tensor:
        return naive_forward(moe, x)  # type: ignore[no-any-return]

    print(
        f"experts {args.experts}, top-{args.top_k}, hidden {args.hidden}, expert width {args.size}; fp32, 1 thread"
    )
    print("| rows | batched (us) | per-token loop (us) | loop / batched |")
    print("|---:|---:|---:|---:|")
    with torch.inference_mode():
        for rows in args.rows:
            x = torch.randn(rows, args.hidden)
            assert torch.allclose(moe.forward(x), naive(x), atol=1e-5)
            calls = max(3, 200 // rows)
            fast: list[float] = []
            slow: list[float] = []
            for _ in range(args.rounds):  # alternating rounds: load on the box hits both alike
                fast.append(timed(lambda: moe.forward(x), calls))  # noqa: B023
                slow.append(timed(lambda: naive(x), calls))  # noqa: B023
            f, s = statistics.median(fast), statistics.median(slow)
            print(f"| {rows} | {f:.0f} | {s:.0f} | {s / f:.2f} |")


def naive_forward(moe: Any, x: Any) -> Any:
    """The reference dispatch: every token, then each of its k experts, one after another."""
    import torch

    from localchat.backends.torch.layers import swiglu
    from localchat.backends.torch.quant import linear

    weights, ids = moe.route(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(moe.top_k):
            expert = moe.experts[int(ids[t, j])]
            out[t] += weights[t, j] * linear(swiglu(linear(x[t : t + 1], expert.gate_up)), expert.down)[0]
    return out


def step_bench(args: argparse.Namespace) -> None:
    import torch

    from localchat.backends.torch.models.moe import SparseMoe
    from tests.helpers.torch_batch import PagedDriver
    from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

    torch.set_num_threads(1)
    hf = tiny_hf_model(
        "qwen3_moe",
        hidden_size=args.hidden,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=1024,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        moe_intermediate_size=args.size,
        norm_topk_prob=True,
    )
    runner = fp32_runner(bundle_from_hf(hf))
    batched = SparseMoe.forward
    print(
        f"decode steps: 4 layers, experts {args.experts}, top-{args.top_k}, hidden {args.hidden}; fp32, 1 thread"
    )
    print("| sequences | batched (ms/step) | per-token loop (ms/step) | loop / batched |")
    print("|---:|---:|---:|---:|")
    for rows in args.rows:
        driver = PagedDriver(runner, num_blocks=rows * 40 + 8, block_size=16)
        for i in range(rows):
            driver.add(f"r{i}", [5 + i, 17, 99, 3])
        driver.step()  # the prefill
        fast: list[float] = []
        slow: list[float] = []
        for _ in range(args.rounds):
            for dispatch, times in ((batched, fast), (naive_forward, slow)):
                SparseMoe.forward = dispatch  # type: ignore[method-assign]
                times.append(timed(driver.step, 3) / 1000)
        SparseMoe.forward = batched  # type: ignore[method-assign]
        f, s = statistics.median(fast), statistics.median(slow)
        print(f"| {rows} | {f:.1f} | {s:.1f} | {s / f:.2f} |")


def timed(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) * 1e6 / calls


def mlx_bench(args: argparse.Namespace) -> None:
    import mlx.core as mx
    import numpy as np

    from localchat.arch.moe import MoeSpec
    from localchat.backends.mlx.layers import silu
    from localchat.backends.mlx.models.moe import SparseMoe
    from localchat.backends.mlx.quant import DenseWeight, linear

    spec = MoeSpec(args.experts, args.top_k, True, args.size, frozenset({0}))
    moe = SparseMoe(spec, args.hidden)
    rng = np.random.default_rng(0)

    def dense(rows: int, cols: int) -> DenseWeight:
        return DenseWeight(mx.array((0.05 * rng.standard_normal((cols, rows))).astype(np.float32)))

    moe.router = dense(args.experts, args.hidden)
    for expert in moe.experts:
        expert.gate_up, expert.down = dense(2 * args.size, args.hidden), dense(args.hidden, args.size)
    per_expert = [(e.gate_up, e.down) for e in moe.experts]
    moe.finish()

    def naive(x: mx.array) -> mx.array:
        probs = mx.softmax(linear(x, moe.router), axis=-1)  # type: ignore[arg-type]
        ids = mx.argpartition(-probs, kth=args.top_k - 1, axis=-1)[:, : args.top_k]
        weights = mx.take_along_axis(probs, ids, axis=-1)
        weights = weights / weights.sum(axis=-1, keepdims=True)
        rows = []
        for t, chosen in enumerate(ids.tolist()):  # one host sync per step, then a loop per token
            out = mx.zeros((args.hidden,))
            for j, e in enumerate(chosen):
                gate, up = mx.split(linear(x[t], per_expert[e][0]), 2, axis=-1)  # type: ignore[arg-type]
                out = out + weights[t, j] * linear(silu(gate) * up, per_expert[e][1])  # type: ignore[arg-type]
            rows.append(out)
        return mx.stack(rows)

    print(f"MLX CPU: experts {args.experts}, top-{args.top_k}, hidden {args.hidden}, width {args.size}; fp32")
    print("| rows | gather_mm (us) | per-token loop (us) | loop / gather_mm |")
    print("|---:|---:|---:|---:|")
    for rows in args.rows:
        x = mx.array(rng.standard_normal((rows, args.hidden)).astype(np.float32))
        assert np.allclose(np.array(moe.forward(x)), np.array(naive(x)), atol=1e-5)
        calls = max(3, 200 // rows)
        fast: list[float] = []
        slow: list[float] = []
        for _ in range(args.rounds):
            fast.append(timed(lambda: mx.eval(moe.forward(x)), calls))  # noqa: B023
            slow.append(timed(lambda: mx.eval(naive(x)), calls))  # noqa: B023
        f, s = statistics.median(fast), statistics.median(slow)
        print(f"| {rows} | {f:.0f} | {s:.0f} | {s / f:.2f} |")


if __name__ == "__main__":
    main()
