"""The engine <-> runner contract: plain data only (lists, numpy), so torch, MLX and fake runners share it.

Per step the engine sends a `SchedulerOutput` (what changed) and a `BatchInputs` (the flat batch, built
once by `engine/batch.py`); the runner answers with a `RunnerOutput` (sampled tokens per request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from localchat.engine.request import ImageInput
from localchat.engine.sampling_inputs import SamplingInputs
from localchat.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class ImageSlice:
    image: ImageInput
    token_rows: list[int]  # indices into the step's flat input_ids
    embed_rows: list[int]  # rows of the image's embeddings that go there


@dataclass(slots=True)
class NewRequestData:
    """A request the runner has not seen (or sees again after preemption). Sent once."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # non-empty only when resuming after preemption
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int  # tokens already in the KV cache (prefix-cache hit)


@dataclass(slots=True)
class CachedRequestData:
    """A request the runner already knows: only the diff since the last step."""

    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens computed this step
    total_num_scheduled_tokens: int
    # Requests the runner must forget (finished, aborted or preempted) before this step runs.
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # Partial prefix reuse (engine/block_manager.py): (source block, destination block, tokens). Before
    # this step's forward, the runner copies the first `tokens` slots of each source block's K/V, every
    # layer, into the destination block (a fresh block of an admitted request); the source is unchanged.
    kv_copies: list[tuple[int, int, int]] = field(default_factory=list)
    # Hybrid models' state checkpoints (engine/state_checkpoints.py): (source slot, destination slot).
    # Before this step's forward (and before rows starting at position 0 are zeroed), the runner copies
    # each source state slot, every stateful layer, into the destination, one copy after the other.
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    # The block manager's step that named this step's new full blocks (forgotten again if the step fails).
    block_step: int = -1

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass(slots=True)
class BatchInputs:
    """One step's flattened batch. Rows are requests in `req_ids` order; tokens are packed row by row."""

    req_ids: list[str]
    input_ids: np.ndarray  # int64 [num_tokens]
    positions: np.ndarray  # int64 [num_tokens]
    slot_mapping: np.ndarray  # int64 [num_tokens]: block_id * block_size + offset, where K/V are written
    query_start_loc: np.ndarray  # int32 [num_reqs + 1]: row i's tokens are [qsl[i], qsl[i+1])
    seq_lens: np.ndarray  # int32 [num_reqs]: context length after this step (cached + new)
    block_tables: np.ndarray  # int32 [num_reqs, max_blocks], padded with the null block 0
    logits_indices: np.ndarray  # int64 [num_sampled]: token index whose logits are sampled
    sample_req_ids: list[str]  # the requests that sample this step, in logits_indices order
    max_query_len: int
    max_seq_len: int
    block_size: int
    # One row per sample_req_ids entry: temperatures, seeds, penalties, logit_bias and the grammar's
    # token_bitmask (engine/sampling_inputs.py). None only in batches that never sample (tests).
    sampling: SamplingInputs | None = None
    # Hybrid models (engine/state_slots.py): int64 [num_reqs], each row's recurrent-state slot. A row
    # whose first position is 0 starts from a zeroed state; any other continues from what it left.
    state_slots: np.ndarray | None = None
    # Pictures with placeholders in this step's tokens: (image, token indices in the flat batch, the
    # matching rows of the image's embeddings). A prefill chunk may carry part of an image.
    image_slices: list[ImageSlice] = field(default_factory=list)
    # M-RoPE models with pictures in the batch (vision/mrope.py): int64 [3, num_tokens], each token's
    # rotary (temporal, height, width) positions; None otherwise: `positions` turn the rotary.
    rope_positions: np.ndarray | None = None
    # SchedulerOutput.kv_copies: copied before the step's forward, once (a runner that splits the step
    # runs them with its first part: they must read each source before any of the step's writes).
    kv_copies: list[tuple[int, int, int]] = field(default_factory=list)
    # SchedulerOutput.state_copies, likewise before the forward, in order (a later copy may read an
    # earlier one's destination).
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    # Hybrid models' verify rows (engine/hybrid_spec.py): int64 [num_tokens], the state row that also
    # receives every stateful layer's state after each token (-1: none); None when no row speculates.
    state_keep: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    def kv_copy_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """`kv_copies` as slot indices: (source slots, destination slots), int64, in the same order."""
        src: list[np.ndarray] = []
        dst: list[np.ndarray] = []
        for source, dest, tokens in self.kv_copies:
            offsets = np.arange(tokens, dtype=np.int64)
            src.append(source * self.block_size + offsets)
            dst.append(dest * self.block_size + offsets)
        if not src:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(src), np.concatenate(dst)


@dataclass(slots=True)
class TokenLogprobs:
    """Logprob of a sampled token (under the model's raw distribution) and the top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class RunnerOutput:
    req_ids: list[str]  # == BatchInputs.sample_req_ids (a speculative request: once per sampled position)
    sampled_token_ids: list[list[int]]  # one list per row (one token each from the torch and MLX runners)
    logprobs: list[list[TokenLogprobs]] | None = None  # aligned with sampled_token_ids, when asked
    # Embedding requests (SamplingParams.embedding) whose prompt ended this step: their mean-pooled,
    # L2-normalised final hidden state (after the final norm). Their sampled_token_ids entry is empty.
    embeddings: dict[str, list[float]] | None = None

    @classmethod
    def one_token_each(
        cls, req_ids: list[str], token_ids: list[int], logprobs: list[TokenLogprobs | None] | None = None
    ) -> RunnerOutput:
        """The usual step: one sampled token per request (logprobs None for rows that did not ask)."""
        return cls(
            req_ids=list(req_ids),
            sampled_token_ids=[[t] for t in token_ids],
            logprobs=None if logprobs is None else [[lp] if lp is not None else [] for lp in logprobs],
        )

    def with_embeddings(self, req_ids: list[str], embeddings: dict[str, list[float]]) -> RunnerOutput:
        """Re-align to all of `req_ids` (the sampled rows plus the finished embedding rows)."""
        if not embeddings:
            return self
        # Walk both in order: a speculative request owns several consecutive rows (engine/speculative.py).
        rows = iter(range(len(self.req_ids)))
        taken = [None if r in embeddings else next(rows) for r in req_ids]
        out = RunnerOutput(
            list(req_ids), [[] if i is None else self.sampled_token_ids[i] for i in taken], None, embeddings
        )
        if self.logprobs is not None:
            logprobs = self.logprobs
            out.logprobs = [[] if i is None else logprobs[i] for i in taken]
        return out


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """What the engine needs to size the KV pool: bytes one block costs across all layers."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    scale_bytes: int = 0  # per token, KV head and K/V: an int8 cache's scale
    dtype_name: str = field(default="", compare=False)  # for the startup log line: "bfloat16", "int8"

    def bytes_per_block(self, block_size: int) -> int:
        # K and V, every layer.
        per_head = self.head_dim * self.dtype_bytes + self.scale_bytes
        return 2 * self.num_layers * block_size * self.num_kv_heads * per_head


@dataclass(frozen=True, slots=True)
class StateCacheSpec:
    """A hybrid model's fixed-size per-sequence state (recurrent and conv windows of its linear-attention
    layers): what one state slot costs. Runners of such models expose it as `state_cache_spec` and take
    `initialize_state_cache(num_slots)`; plain transformers have neither."""

    num_layers: int  # layers that keep a state instead of K/V
    bytes_per_slot: int  # every such layer's state for one sequence


class ModelRunner(Protocol):
    """Implemented by localchat/backends/torch, localchat/backends/mlx and localchat/backends/fake."""

    @property
    def kv_cache_spec(self) -> KVCacheSpec: ...

    @property
    def device_name(self) -> str: ...

    def available_kv_memory(self) -> int | None:
        """Bytes free for the KV cache after weights and a warm-up, or None when unknown."""
        ...

    def initialize_kv_cache(self, num_blocks: int, block_size: int) -> None: ...

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput: ...

    def shutdown(self) -> None: ...
