"""Bound the two shape-keyed caches behind torch's CPU matmuls, before the first one runs.

oneDNN keeps a compiled primitive per GEMM shape (ONEDNN_PRIMITIVE_CACHE_CAPACITY, default 1024) and
torch's ideep layer a computation per shape (LRU_CACHE_CAPACITY, default 1024). A server sees a new
row count M with almost every prompt length (prefill chunks over 24 rows run as dense bf16 GEMMs), and
each new M adds an entry per weight shape: ~0.9 MiB each on SmolLM2's shapes. With the defaults that is
~2 MiB of resident memory per distinct prompt length, up to ~1.8 GiB, which the soak benchmark showed as
steady growth. 64 entries hold a dozen recent lengths' shapes (the decode shapes stay hot) at ~60 MiB;
steady-state speed on repeated shapes is unchanged (measured, benchmarks notes in the README).
Both variables are read when the first primitive is created, so setting them after `import torch` works;
a value the user set wins.
"""

from __future__ import annotations

import os

CACHE_ENTRIES = "64"


def bound_matmul_caches() -> None:
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", CACHE_ENTRIES)
    os.environ.setdefault("LRU_CACHE_CAPACITY", CACHE_ENTRIES)
