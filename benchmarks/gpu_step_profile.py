"""Where a GPU decode step's time goes: the engine's own work (schedule, batch building, bookkeeping),
the model forward (graph replay or eager, synchronized), and sampling; then the top Python functions by
own time. Same random-weight models as gpu_bench.py.

python benchmarks/gpu_step_profile.py --shape llama3-8b --quant bf16
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_bench import build_engine, model_parser


def main() -> None:
    parser = model_parser(__doc__)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=0, help="also run one prompt of this many tokens")
    args = parser.parse_args()

    import torch

    from localchat.engine.sampling_params import SamplingParams

    engine, _, _ = build_engine(args.shape, args.quant, not args.no_cuda_graphs, 64)
    runner = engine.runner  # type: ignore[attr-defined]
    spent = {"forward": 0.0, "execute": 0.0}
    logits_fn, execute_fn = runner._logits, runner.execute_model

    def timed_logits(batch):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        out = logits_fn(batch)
        torch.cuda.synchronize()
        spent["forward"] += time.perf_counter() - start
        return out

    def timed_execute(*a):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        out = execute_fn(*a)
        spent["execute"] += time.perf_counter() - start
        return out

    runner._logits, runner.execute_model = timed_logits, timed_execute
    if args.prompt:
        ids = list(range(10, 10 + args.prompt))
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # type: ignore[attr-defined]
        start = time.perf_counter()
        while engine.has_unfinished:  # type: ignore[attr-defined]
            for out in engine.step():  # type: ignore[attr-defined]
                if out.error:
                    print("prompt failed:", out.error)
        print(f"{args.prompt}-token prompt: {(time.perf_counter() - start) * 1000:.0f} ms for 2 tokens")

    engine.add_request(
        list(range(10, 42)), SamplingParams(temperature=0, max_tokens=args.steps + 8, ignore_eos=True)
    )  # type: ignore[attr-defined]
    for _ in range(8):  # prefill and warm-up
        engine.step()  # type: ignore[attr-defined]
    spent.update(forward=0.0, execute=0.0)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    for _ in range(args.steps):
        engine.step()  # type: ignore[attr-defined]
    profile.disable()
    wall = time.perf_counter() - start
    per = 1000 / args.steps
    print(
        f"\n{args.shape} {args.quant}, graphs {'off' if args.no_cuda_graphs else 'on'}, {args.steps} decode steps (under cProfile)"
    )
    print("| part | ms / step |\n|---|---|")
    print(f"| whole engine step | {wall * per:.3f} |")
    print(f"| engine outside the runner | {(wall - spent['execute']) * per:.3f} |")
    print(f"| model forward (synchronized) | {spent['forward'] * per:.3f} |")
    print(f"| runner besides the forward (sampling) | {(spent['execute'] - spent['forward']) * per:.3f} |")
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)

    # without the profiler: the plain rate and a pure graph-replay rate for the same step
    engine.add_request(
        list(range(10, 42)), SamplingParams(temperature=0, max_tokens=args.steps + 8, ignore_eos=True)
    )  # type: ignore[attr-defined]
    for _ in range(8):
        engine.step()  # type: ignore[attr-defined]
    spent.update(forward=0.0, execute=0.0)
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()  # type: ignore[attr-defined]
    wall = time.perf_counter() - start
    print(
        f"without cProfile: {wall * per:.3f} ms / step ({args.steps / wall:.0f} tok/s), forward {spent['forward'] * per:.3f} ms"
    )


if __name__ == "__main__":
    main()
