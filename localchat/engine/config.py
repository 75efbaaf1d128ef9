"""Engine knobs (one object; the CLI and LOCALCHAT_* settings fill it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from localchat.engine.speculative import SpeculativeConfig
from localchat.errors import InvalidRequestError

DEFAULT_STATE_CHECKPOINTS = 8  # hybrid models' prefix checkpoints (a few: each is a whole state slot)


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    kv_cache_mib: int | None = None  # None: ask the runner how much memory is free
    max_num_seqs: int = 32  # requests decoded together
    max_num_batched_tokens: int = 1024  # token budget of one step
    prefill_chunk_size: int = 512  # longest prefill piece per request per step; 0 disables chunking
    max_model_len: int | None = None  # None: the model's own, capped by what the KV pool can hold
    enable_prefix_caching: bool = True
    # Hybrid models: state slots kept as prefix-cache checkpoints (engine/state_checkpoints.py), out of
    # the same memory budget; 0 turns prefix caching off for them.
    state_checkpoints: int = DEFAULT_STATE_CHECKPOINTS
    max_queue_len: int = 256  # requests waiting beyond max_num_seqs before new ones get 503
    # Blocks kept free when admitting a new request, so running ones can grow before anyone is preempted.
    watermark_fraction: float = 0.01
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)  # engine/speculative.py

    def validate(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", param=name)
        if self.state_checkpoints < 0:
            raise InvalidRequestError("state_checkpoints must be >= 0 (0: no hybrid prefix caching)")
        if self.prefill_chunk_size < 0:
            raise InvalidRequestError("prefill_chunk_size must be >= 0 (0 disables chunking)")
        if self.kv_cache_mib is not None and self.kv_cache_mib < 1:
            raise InvalidRequestError("kv_cache_mib (--kv-cache-mib) must be >= 1 MiB")
        self.speculative.validate()
