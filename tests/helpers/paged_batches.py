"""Hand-made paged batches (ragged rows, cached prefixes, block tables with holes) for attention tests.

No side effects on import: the GPU tests use these without Triton's interpreter."""

from __future__ import annotations

import numpy as np

from localchat.engine.interface import BatchInputs


def make_batch(rows: list[tuple[int, int]], block_size: int, num_blocks: int, seed: int = 0) -> BatchInputs:
    """rows: (context length after the step, new tokens this step). Blocks are a random permutation
    of the pool (so tables have holes and are never consecutive); tables are padded with block 0."""
    rng = np.random.default_rng(seed)
    pool = rng.permutation(np.arange(1, num_blocks))
    width = max(-(-seq // block_size) for seq, _ in rows)
    tables = np.zeros((len(rows), width), dtype=np.int32)
    positions, slots, qsl = [], [], [0]
    used = 0
    for i, (seq, new) in enumerate(rows):
        blocks = pool[used : used + -(-seq // block_size)]
        used += len(blocks)
        tables[i, : len(blocks)] = blocks
        pos = np.arange(seq - new, seq)
        positions.append(pos)
        slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        qsl.append(qsl[-1] + new)
    positions_a = np.concatenate(positions).astype(np.int64)
    last = np.array(qsl[1:], dtype=np.int64) - 1
    return BatchInputs(
        req_ids=[f"r{i}" for i in range(len(rows))],
        input_ids=np.zeros(len(positions_a), dtype=np.int64),
        positions=positions_a,
        slot_mapping=np.concatenate(slots).astype(np.int64),
        query_start_loc=np.array(qsl, dtype=np.int32),
        seq_lens=np.array([seq for seq, _ in rows], dtype=np.int32),
        block_tables=tables,
        logits_indices=last,
        sample_req_ids=[f"r{i}" for i in range(len(rows))],
        max_query_len=max(new for _, new in rows),
        max_seq_len=max(seq for seq, _ in rows),
        block_size=block_size,
    )
