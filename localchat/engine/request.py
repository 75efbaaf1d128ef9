"""A generation request as the scheduler sees it: tokens known, tokens computed, blocks held."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from localchat.engine.constraint import TokenMatcher
from localchat.engine.loop_guard import LOOP_STOP_REASON, is_looping
from localchat.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # client gone, stop button, shutdown
    ERROR = "error"  # the runner failed on this request's step

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True, eq=False)
class ImageInput:
    """One picture of a prompt: the prompt positions of its placeholder tokens (the runner scatters the
    image's embedding rows there), its preprocessed pixels (a numpy array; the engine never reads them) and
    its content hash, which names it in the encoder cache and in prefix-cache block hashes."""

    placeholders: tuple[int, ...]
    content_hash: str
    pixels: Any = None
    # M-RoPE models (Qwen2.5-VL, Qwen3-VL): the image's token grid (frames, rows, columns) after the
    # spatial merge, which gives its tokens 3-D positions (localchat/vision/mrope.py); None elsewhere.
    grid: tuple[int, int, int] | None = None


@dataclass(slots=True, eq=False)
class Request:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    arrival_time: float = field(default_factory=time.monotonic)  # when the caller submitted it
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = -1  # prefix-cache hit at first admission (-1: not admitted yet)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of this request's full blocks
    num_registered_blocks: int = 0  # leading blocks of block_ids already offered to the prefix cache
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    num_preemptions: int = 0
    last_token_time: float | None = None  # when its latest output token came out (None: none yet)
    # Advanced by every accepted output token; it stays here across preemption (outputs are kept too).
    matcher: TokenMatcher | None = None
    embedding: list[float] | None = None  # the pooled vector of an embedding request, once computed
    # Draft tokens scheduled this step after its last token (engine/speculative.py); not in all_token_ids.
    spec_token_ids: list[int] = field(default_factory=list)
    # With a sampling draft model: the distribution q each of those drafts was drawn from (aligned with
    # spec_token_ids, possibly longer; engine/spec_sampling.py). None: the drafts are deterministic.
    spec_draft_probs: list[Any] | None = None
    spec_k: int = 0  # its current draft length (speculative.adapt_k); 0 = not set yet: the configured k
    spec_low: int = 0  # verification steps in a row that kept under half of the drafts
    spec_misses: int = 0  # draft runs in a row of which the model kept nothing
    spec_pause: int = 0  # decode steps left before drafts are proposed again (backoff after misses)
    # This request's share of the engine's speculation counters (the UI's per-message stats): draft tokens
    # scored, of which accepted, and target passes that gave it tokens.
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    num_target_passes: int = 0
    images: tuple[ImageInput, ...] = ()  # pictures whose placeholders sit in the prompt

    def image_hashes_in(self, start: int, end: int) -> tuple[str, ...]:
        """Content hashes of the images with a placeholder in token positions [start, end)."""
        return tuple(
            image.content_hash
            for image in self.images
            if any(start <= pos < end for pos in image.placeholders)
        )

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def check_token_stop(self, max_model_len: int) -> FinishReason | None:
        """Stop conditions visible from token ids alone (stop strings are the detokenizer's job)."""
        params = self.sampling_params
        last = self.output_token_ids[-1]
        if not params.ignore_eos and last in self.eos_token_ids:
            self.stop_reason = last
            return FinishReason.STOP
        if last in params.stop_token_ids:
            self.stop_reason = last
            return FinishReason.STOP
        if self.num_output_tokens >= params.max_tokens or self.num_tokens >= max_model_len:
            return FinishReason.LENGTH
        if not params.ignore_eos and is_looping(self.output_token_ids, params.loop_stop):
            self.stop_reason = LOOP_STOP_REASON  # finish_reason "length", with the reason shown
            return FinishReason.LENGTH
        return None
