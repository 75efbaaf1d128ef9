"""Paged decode attention on a GPU: the Triton kernels against the gather path (attention.py, what the
CPU uses), PyTorch's flex_attention over the physical cache with a page-table mask, and, when
importable, flash-attn's paged `flash_attn_with_kvcache`. Llama-3-8B heads (32 query
/ 8 KV, head_dim 128), bf16, block size 16, random block tables. Prints microseconds per layer call.

`--cpu`: the CPU decode step instead, localchat's fused C kernel (csrc/lc_attention.h) against the
pure-torch gather path (`LOCALCHAT_KERNELS=off`), for SmolLM2-135M heads (9 / 3 KV, head_dim 64) and
Llama-3-8B heads, bf16 cache: median microseconds per layer call (cache write included), variants
alternated round by round in one process, and their ratio.

python benchmarks/attention_bench.py [--rows 1 16 64] [--context 512 4096]
python benchmarks/attention_bench.py --cpu [--rows 1 16] [--context 256 2048]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn: Callable[[], object], repeat: int = 50) -> float:
    import torch

    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeat  # microseconds


def flex_time(q: object, cache: object, batch: object, timer: Callable[[Callable[[], object]], float]) -> str:
    """flex_attention reading the physical cache [1, kv_heads, slots, d]: a mask_mod admits the slots of
    each row's own blocks below its length (slot -> (row, position) maps built from the block tables)."""
    import numpy as np
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    try:
        dev = q.device  # type: ignore[attr-defined]
        slots = cache.shape[2]  # type: ignore[attr-defined]
        bs = batch.block_size  # type: ignore[attr-defined]
        owner = np.full(slots, -1, dtype=np.int64)
        position = np.zeros(slots, dtype=np.int64)
        for row, table in enumerate(batch.block_tables):  # type: ignore[attr-defined]
            for logical, block in enumerate(table):
                if block:
                    owner[block * bs : (block + 1) * bs] = row
                    position[block * bs : (block + 1) * bs] = logical * bs + np.arange(bs)
        owner_t, pos_t = torch.from_numpy(owner).to(dev), torch.from_numpy(position).to(dev)
        lens = torch.from_numpy(batch.seq_lens.astype(np.int64)).to(dev)  # type: ignore[attr-defined]

        def visible(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
            return (owner_t[kv_idx] == b) & (pos_t[kv_idx] < lens[b])

        rows = q.shape[0]  # type: ignore[attr-defined]
        mask = create_block_mask(visible, rows, None, 1, slots, device=dev)
        query = q[:, :, None].contiguous()  # type: ignore[index]  # [rows, heads, 1, d]
        keys = cache[0][None].expand(rows, -1, -1, -1)  # type: ignore[index]
        values = cache[1][None].expand(rows, -1, -1, -1)  # type: ignore[index]
        compiled = torch.compile(flex_attention)
        return f"{timer(lambda: compiled(query, keys, values, block_mask=mask, enable_gqa=True)):.0f}"
    except Exception as exc:  # experimental API: report, do not abort the table
        return f"n/a ({type(exc).__name__})"


def cpu_table(rows_list: list[int], contexts: list[int], rounds: int) -> None:
    import os
    import statistics
    import time

    import torch

    from localchat.backends.torch.attention import AttentionMetadata, paged_attention
    from localchat.backends.torch.cpu.kernels import KERNELS_ENV, load
    from tests.helpers.paged_batches import make_batch

    ops = load()
    if ops is None:
        sys.exit("localchat's CPU kernels are not built (python setup.py build_ext --inplace).")
    block = 16
    print(f"CPU, {torch.get_num_threads()} threads, {ops.name} kernels, bf16 cache, block size {block}")
    print("| heads / KV / d | rows | context | fused C µs | torch gather µs | torch / fused |")
    print("|---|---|---|---|---|---|")
    for heads, kv_heads, head_dim in [(9, 3, 64), (32, 8, 128)]:
        for rows in rows_list:
            for context in contexts:
                blocks = rows * -(-context // block) + 2
                batch = make_batch([(context, 1)] * rows, block, blocks)
                q = torch.randn(rows, heads, head_dim, dtype=torch.bfloat16)
                k = torch.randn(rows, kv_heads, head_dim, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                cache = torch.randn(2, kv_heads, blocks * block, head_dim).to(torch.bfloat16)
                metas = {}
                for name, choice in (("fused", "auto"), ("torch", "off")):
                    os.environ[KERNELS_ENV] = choice
                    metas[name] = AttentionMetadata.from_batch(batch, torch.device("cpu"), kv_heads)
                os.environ.pop(KERNELS_ENV)
                times: dict[str, list[float]] = {"fused": [], "torch": []}
                calls = max(5, 20000 // context)
                for _ in range(rounds):  # alternate so that load on the box hits both alike
                    for name, meta in metas.items():
                        start = time.perf_counter()
                        for _ in range(calls):
                            paged_attention(q, k, v, cache, meta)
                        times[name].append((time.perf_counter() - start) / calls * 1e6)
                fused, plain = statistics.median(times["fused"]), statistics.median(times["torch"])
                print(
                    f"| {heads} / {kv_heads} / {head_dim} | {rows} | {context} | {fused:.0f} | {plain:.0f} "
                    f"| {plain / fused:.2f} |"
                )


def cpu_int8_table(rows_list: list[int], contexts: list[int], rounds: int) -> None:
    """The fused C decode kernel over a bf16 cache against an int8 one (--kv-cache-dtype int8), and the
    pure-torch path over the int8 cache; alternating rounds, median µs per layer call."""
    import os
    import statistics
    import time

    import torch

    from localchat.backends.torch.attention import AttentionMetadata, paged_attention
    from localchat.backends.torch.cpu.kernels import KERNELS_ENV, load
    from localchat.backends.torch.kv_cache import Int8KVCache, quantize_rows
    from tests.helpers.paged_batches import make_batch

    ops = load()
    if ops is None:
        sys.exit("localchat's CPU kernels are not built (python setup.py build_ext --inplace).")
    block = 16
    print(f"CPU, {torch.get_num_threads()} threads, {ops.name} kernels, block size {block}, µs per layer")
    print("| heads / KV / d | rows | context | fused bf16 | fused int8 | bf16 / int8 | torch int8 |")
    print("|---|---|---|---|---|---|---|")
    for heads, kv_heads, head_dim in [(9, 3, 64), (32, 8, 128)]:
        for rows in rows_list:
            for context in contexts:
                blocks = rows * -(-context // block) + 2
                batch = make_batch([(context, 1)] * rows, block, blocks)
                q = torch.randn(rows, heads, head_dim, dtype=torch.bfloat16)
                k = torch.randn(rows, kv_heads, head_dim, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                bf16 = torch.randn(2, kv_heads, blocks * block, head_dim).to(torch.bfloat16)
                int8 = Int8KVCache(*quantize_rows(bf16))
                metas = {}
                for name, choice in (("fused", "auto"), ("torch", "off")):
                    os.environ[KERNELS_ENV] = choice
                    metas[name] = AttentionMetadata.from_batch(batch, torch.device("cpu"), kv_heads)
                os.environ.pop(KERNELS_ENV)
                variants = {
                    "fused bf16": (metas["fused"], bf16),
                    "fused int8": (metas["fused"], int8),
                    "torch int8": (metas["torch"], int8),
                }
                times: dict[str, list[float]] = {name: [] for name in variants}
                calls = max(5, 20000 // context)
                for _ in range(rounds):  # alternate so that load on the box hits all alike
                    for name, (meta, cache) in variants.items():
                        start = time.perf_counter()
                        for _ in range(calls):
                            paged_attention(q, k, v, cache, meta)
                        times[name].append((time.perf_counter() - start) / calls * 1e6)
                t = {name: statistics.median(v) for name, v in times.items()}
                print(
                    f"| {heads} / {kv_heads} / {head_dim} | {rows} | {context} | {t['fused bf16']:.0f} "
                    f"| {t['fused int8']:.0f} | {t['fused bf16'] / t['fused int8']:.2f} | {t['torch int8']:.0f} |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--cpu", action="store_true", help="the CPU decode step: fused C kernel vs torch")
    parser.add_argument("--rounds", type=int, default=7, help="--cpu: alternating rounds per variant")
    parser.add_argument(
        "--cpu-int8", action="store_true", help="the CPU decode step over a bf16 vs an int8 KV cache"
    )
    args = parser.parse_args()
    if args.cpu_int8:
        cpu_int8_table(args.rows, args.context, args.rounds)
        return
    if args.cpu:
        cpu_table(args.rows, args.context, args.rounds)
        return

    import torch

    from localchat.backends.torch.attention import AttentionMetadata, paged_attention
    from localchat.backends.torch.cuda.gpu_attention_meta import TritonAttentionMetadata
    from localchat.backends.torch.cuda.triton_attention import triton_paged_attention
    from tests.helpers.paged_batches import make_batch

    try:
        from flash_attn import flash_attn_with_kvcache  # type: ignore[import-not-found]
    except ImportError:
        flash_attn_with_kvcache = None
    heads, kv_heads, head_dim, block = 32, 8, 128, 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("| rows | context | triton µs | gather path µs | flex_attention µs | flash-attn µs |")
    print("|---|---|---|---|---|---|")
    for rows in args.rows:
        for context in args.context:
            blocks = rows * -(-context // block) + 2
            batch = make_batch([(context, 1)] * rows, block, blocks)
            dev = torch.device("cuda")
            q = torch.randn(rows, heads, head_dim, device=dev, dtype=torch.bfloat16)
            k = torch.randn(rows, kv_heads, head_dim, device=dev, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            cache = torch.randn(2, kv_heads, blocks * block, head_dim, device=dev, dtype=torch.bfloat16)
            tmeta = TritonAttentionMetadata.from_batch(batch, dev, kv_heads, sms)
            gmeta = AttentionMetadata.from_batch(batch, dev, kv_heads)
            t_triton = timed(lambda: triton_paged_attention(q, k, v, cache, tmeta))  # noqa: B023
            t_gather = timed(lambda: paged_attention(q, k, v, cache, gmeta))  # noqa: B023
            t_flex = flex_time(q, cache, batch, timed)
            t_flash = "—"
            if flash_attn_with_kvcache is not None:
                # flash-attn wants [blocks, block_size, kv_heads, d] per K and V: a copy in its layout.
                kc = cache[0].view(kv_heads, blocks, block, head_dim).permute(1, 2, 0, 3).contiguous()
                vc = cache[1].view(kv_heads, blocks, block, head_dim).permute(1, 2, 0, 3).contiguous()
                table = torch.from_numpy(batch.block_tables).to(dev)
                lens = torch.from_numpy(batch.seq_lens).to(dev)
                try:  # flash-attn 2 wants pages of 256 tokens: it may refuse block size 16
                    t_flash = f"{timed(lambda: flash_attn_with_kvcache(q[:, None], kc, vc, cache_seqlens=lens, block_table=table)):.0f}"  # noqa: B023
                except Exception as exc:
                    t_flash = f"n/a ({type(exc).__name__})"
            print(f"| {rows} | {context} | {t_triton:.0f} | {t_gather:.0f} | {t_flex} | {t_flash} |")


if __name__ == "__main__":
    main()
