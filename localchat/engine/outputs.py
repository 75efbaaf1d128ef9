"""What the engine reports per request per step."""

from __future__ import annotations

from dataclasses import dataclass, field

from localchat.engine.interface import TokenLogprobs
from localchat.engine.latency import HistogramSnapshot
from localchat.engine.request import FinishReason


@dataclass(slots=True)
class RequestOutput:
    req_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    error: str | None = None  # set with finish_reason ERROR
    embedding: list[float] | None = None  # an embedding request's pooled vector (when finished)
    # Speculative decoding so far for this request (0 without it): draft tokens scored, of which accepted,
    # and target passes that gave it tokens (num_output_tokens over it: tokens per pass).
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    num_target_passes: int = 0


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_blocks_touched: int  # handed out at least once: on CPU, the pool's resident part
    block_size: int
    prefix_hit_rate: float
    num_preemptions: int
    generation_tokens_per_s: float  # over the recent window
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished_total: int
    requests_failed_total: int
    max_model_len: int
    time_to_first_token: HistogramSnapshot
    inter_token_latency: HistogramSnapshot
    # Hybrid models' per-sequence state pool (engine/state_slots.py); 0 for plain transformers.
    state_slots_used: int = 0
    state_slots_total: int = 0
    state_bytes_per_slot: int = 0
    prefix_caching_enabled: bool = True  # hybrid models: with state checkpoints (state_checkpoints.py)
    state_checkpoints_used: int = 0  # hybrid models' checkpoint slots holding a state
    state_checkpoints_total: int = 0
    state_checkpoint_saves_total: int = 0
    state_checkpoint_restores_total: int = 0
    max_num_seqs: int = 0  # the configured bound on sequences decoded together
    # Speculative decoding (engine/speculative.py): the method in use, draft tokens scored and kept, and
    # target passes that gave a sequence tokens (generation_tokens_total over it: tokens per pass).
    speculative_method: str = "off"
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    sequence_passes_total: int = 0
    spec_draft_length_avg: float = 0.0  # the running sequences' current draft length K, averaged
    speculative_auto_reason: str = ""  # why `--speculative auto` picked speculative_method ("" if not auto)

    @property
    def spec_acceptance_rate(self) -> float:
        return (
            self.spec_accepted_tokens_total / self.spec_draft_tokens_total
            if self.spec_draft_tokens_total
            else 0.0
        )

    @property
    def tokens_per_target_pass(self) -> float:
        return (
            self.generation_tokens_total / self.sequence_passes_total if self.sequence_passes_total else 0.0
        )
