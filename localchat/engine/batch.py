"""Build the backend-neutral `BatchInputs` for one step, once, as numpy arrays."""

from __future__ import annotations

import numpy as np

from localchat.engine.interface import BatchInputs, ImageSlice, SchedulerOutput
from localchat.engine.request import Request
from localchat.engine.sampling_inputs import build_sampling_inputs, decode_sampling_inputs
from localchat.engine.sampling_params import SamplingParams
from localchat.vision.mrope import mrope_positions, uses_mrope
from localchat.vision.placement import chunk_rows


def build_batch(
    scheduler_output: SchedulerOutput,
    requests: dict[str, Request],
    block_size: int,
    state_slots: dict[str, int] | None = None,
) -> BatchInputs:
    """Rows follow `num_scheduled_tokens` order (running requests first, then newly admitted ones).

    A row samples when this step reaches the end of its known tokens; a middle prefill chunk does not.
    `state_slots` (hybrid models): each request's state slot, sent per row.
    A row with draft tokens (`Request.spec_token_ids`, engine/speculative.py) feeds them after its last
    token and samples at its last token and at every draft: one sampling row each, in order, whose
    penalties and seed index see the drafts before it as if they were output already.
    """
    req_ids = list(scheduler_output.num_scheduled_tokens)
    decoding = _decode_rows(scheduler_output, requests, block_size)
    if decoding is not None:
        return _decode_batch(scheduler_output, req_ids, decoding, block_size, state_slots)
    num_reqs = len(req_ids)
    num_tokens = scheduler_output.total_num_scheduled_tokens
    input_ids = np.empty(num_tokens, dtype=np.int64)
    positions = np.empty(num_tokens, dtype=np.int64)
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    seq_lens = np.empty(num_reqs, dtype=np.int32)
    logits_indices: list[int] = []
    sample_req_ids: list[str] = []
    block_lists: list[list[int]] = []
    sampling_rows: list[tuple[SamplingParams, list[int], int]] = []
    spec_rows: list[tuple[int, int, np.ndarray]] = []  # (sampling row, draft, q): engine/spec_sampling.py
    image_slices: list[ImageSlice] = []
    mrope_rows: list[tuple[int, Request, int, int]] = []  # (offset, request, start, end)

    offset = 0
    for row, req_id in enumerate(req_ids):
        request = requests[req_id]
        count = scheduler_output.num_scheduled_tokens[req_id]
        drafts = request.spec_token_ids
        start = request.num_computed_tokens
        end = start + count
        known_end = end - len(drafts)
        input_ids[offset : offset + count - len(drafts)] = request.all_token_ids[start:known_end]
        input_ids[offset + count - len(drafts) : offset + count] = drafts
        positions[offset : offset + count] = np.arange(start, end)
        if request.images and uses_mrope(request.images):
            mrope_rows.append((offset, request, start, end))
        for image in request.images:
            token_rows, embed_rows = chunk_rows(list(image.placeholders), start, known_end)
            if token_rows:
                image_slices.append(ImageSlice(image, [offset + r for r in token_rows], embed_rows))
        offset += count
        query_start_loc[row + 1] = offset
        seq_lens[row] = end
        block_lists.append(request.block_ids)
        if known_end == request.num_tokens:
            params, prompt_len = request.sampling_params, request.num_prompt_tokens
            draft_probs = request.spec_draft_probs if drafts else None  # a sampling draft model's q
            for j in range(len(drafts) + 1):
                logits_indices.append(offset - 1 - len(drafts) + j)
                sample_req_ids.append(req_id)
                if draft_probs is not None and j < len(drafts):
                    spec_rows.append((len(sampling_rows), drafts[j], draft_probs[j]))
                tokens = request.all_token_ids + drafts[:j] if j else request.all_token_ids
                sampling_rows.append((params, tokens, prompt_len))

    max_blocks = max((len(b) for b in block_lists), default=0)
    block_tables = np.zeros((num_reqs, max(max_blocks, 1)), dtype=np.int32)  # 0 = null block
    for row, blocks in enumerate(block_lists):
        block_tables[row, : len(blocks)] = blocks
    # Slot of each token: its block (through the row's table) times block_size plus the offset within.
    rows = np.repeat(np.arange(num_reqs), np.diff(query_start_loc))
    slot_mapping = (
        block_tables[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    )
    query_lens = np.diff(query_start_loc)
    rope_positions = None
    if mrope_rows:  # 3-D positions for rows whose pictures have them; others repeat their 1-D ones
        rope_positions = np.broadcast_to(positions, (3, num_tokens)).copy()
        for at, request, start, end in mrope_rows:
            rope_positions[:, at : at + end - start] = mrope_positions(request.images, start, end)
    return BatchInputs(
        req_ids=req_ids,
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=np.asarray(logits_indices, dtype=np.int64),
        sample_req_ids=sample_req_ids,
        max_query_len=int(query_lens.max()) if num_reqs else 0,
        max_seq_len=int(seq_lens.max()) if num_reqs else 0,
        block_size=block_size,
        state_slots=None
        if state_slots is None
        else np.asarray([state_slots[r] for r in req_ids], dtype=np.int64),
        sampling=build_sampling_inputs(sampling_rows, spec_rows),
        image_slices=image_slices,
        rope_positions=rope_positions,
        kv_copies=list(scheduler_output.kv_copies),
        state_copies=list(scheduler_output.state_copies),
    )


def _decode_rows(
    scheduler_output: SchedulerOutput, requests: dict[str, Request], block_size: int
) -> list[Request] | None:
    """The step's requests when every row is one plain decode token (the common step: one token after
    the last, sampled, no drafts or pictures, its block allocated); else None (the general path)."""
    if not scheduler_output.num_scheduled_tokens:
        return None
    rows: list[Request] = []
    for req_id, count in scheduler_output.num_scheduled_tokens.items():
        request = requests[req_id]
        if (
            count != 1
            or request.spec_token_ids
            or request.images
            or request.num_computed_tokens + 1 != len(request.all_token_ids)
            or request.num_computed_tokens // block_size >= len(request.block_ids)
        ):
            return None
        rows.append(request)
    return rows


def _decode_batch(
    scheduler_output: SchedulerOutput,
    req_ids: list[str],
    requests: list[Request],
    block_size: int,
    state_slots: dict[str, int] | None,
) -> BatchInputs:
    """`build_batch` for a step of plain decode rows (`_decode_rows`), the same arrays with fewer numpy
    calls: it runs once per decode token, on caches the weight streaming has just emptied (#34)."""
    num_reqs = len(requests)
    positions_list = [r.num_computed_tokens for r in requests]
    positions = np.array(positions_list, dtype=np.int64)
    tables = [r.block_ids for r in requests]
    if num_reqs == 1:
        block_tables = np.array(tables, dtype=np.int32)
    else:
        block_tables = np.zeros((num_reqs, max(len(t) for t in tables)), dtype=np.int32)
        for row, blocks in enumerate(tables):
            block_tables[row, : len(blocks)] = blocks
    slots = [
        t[p // block_size] * block_size + p % block_size for t, p in zip(tables, positions_list, strict=True)
    ]
    seq_lens = np.array(positions_list, dtype=np.int32) + 1
    return BatchInputs(
        req_ids=req_ids,
        input_ids=np.array([r.all_token_ids[-1] for r in requests], dtype=np.int64),
        positions=positions,
        slot_mapping=np.array(slots, dtype=np.int64),
        query_start_loc=np.arange(num_reqs + 1, dtype=np.int32),
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=np.arange(num_reqs, dtype=np.int64),
        sample_req_ids=list(req_ids),
        max_query_len=1,
        max_seq_len=max(positions_list) + 1,
        block_size=block_size,
        state_slots=None
        if state_slots is None
        else np.asarray([state_slots[r] for r in req_ids], dtype=np.int64),
        sampling=decode_sampling_inputs(
            [(r.sampling_params, r.all_token_ids, r.num_prompt_tokens) for r in requests]
        ),
        kv_copies=list(scheduler_output.kv_copies),
        state_copies=list(scheduler_output.state_copies),
    )
