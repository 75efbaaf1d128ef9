"""Mixture-of-experts dispatch on CPU: the torch backend's batched dispatch (pairs sorted by expert, each
active expert once over its gathered rows; localchat/backends/torch/models/moe.py) against a naive loop
over tokens and their chosen experts, on one tiny MoE block (fp32, one thread). Both run in the same
process in alternating rounds; prints the median microseconds per block call and the ratio.
`--backend mlx`: the MLX block (stacked experts, `mx.gather_mm`) against the same per-token loop.

python benchmarks/moe_bench.py [--backend torch|mlx] [--rows 1 4 16 64] [--experts 16] [--top-k 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    from localchat.arch.moe import MoeSpec
    from localchat.backends.torch.layers import swiglu
    from localchat.backends.torch.models.moe import SparseMoe
    from localchat.backends.torch.quant import linear

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backend", choices=["torch", "mlx"], default="torch")
    args = parser.parse_args()
    if args.backend == "mlx":
        mlx_bench(args)
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = MoeSpec(args.experts, args.top_k, True, args.size, frozenset({0}))
    moe = SparseMoe(spec, args.hidden)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(0.05 * torch.randn_like(p))

    def naive(x: torch.Tensor) -> torch.Tensor:
        weights, ids = moe.route(x)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(args.top_k):
                expert = moe.experts[int(ids[t, j])]
                y = linear(swiglu(linear(x[t : t + 1], expert.gate_up)), expert.down)  # type: ignore[arg-type]
                out[t] += weights[t, j] * y[0]
        return out

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
