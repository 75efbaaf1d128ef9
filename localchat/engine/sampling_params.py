"""Per-request sampling settings, validated once at the edge so the engine never sees bad values."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localchat.errors import InvalidRequestError

if TYPE_CHECKING:
    from localchat.engine.constraint import Constraint

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16  # OpenAI allows 4; more is an extension (README, "Chat completions")
MAX_TEMPERATURE = 2.0
MAX_LOGIT_BIAS = 100.0  # OpenAI's range; -100 bans the token


@dataclass(slots=True)
class SamplingParams:
    """What to sample and when to stop. `temperature == 0` means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0  # 0 (or -1) disables
    top_p: float = 1.0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: sampled token's logprob plus top-k alternatives
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit; -100 bans it
    constraint: Constraint | None = None  # a compiled grammar the output must follow
    embedding: bool = False  # prefill only; answer the pooled final hidden state instead of sampling
    # Stop when the last this-many tokens are one short period repeated (engine/loop_guard.py); 0: never.
    # The server sets it from --loop-stop; the library's default leaves output untouched.
    loop_stop: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self) -> None:
        _check_int("max_tokens", self.max_tokens, low=1)
        # OpenAI's range: above 2 every token is near-equally likely, never what a client meant.
        _check_float("temperature", self.temperature, low=0.0, high=MAX_TEMPERATURE)
        if self.top_k == -1:
            self.top_k = 0
        _check_int("top_k", self.top_k, low=0)
        _check_float("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        _check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _check_float("repetition_penalty", self.repetition_penalty, low=0.0, high=10.0, low_open=True)
        if self.seed is not None:
            _check_int("seed", self.seed, low=-(2**63), high=2**64 - 1)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidRequestError("'stop' must be a string or a list of strings.", param="stop")
        self.stop = [s for s in self.stop if s]
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"'stop' may hold at most {MAX_STOP_STRINGS} strings.", param="stop")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise InvalidRequestError(
                "'stop_token_ids' must be non-negative integers.", param="stop_token_ids"
            )
        _check_int("loop_stop", self.loop_stop, low=0)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0, high=MAX_LOGPROBS)
        if self.logit_bias is not None:
            for token_id, bias in self.logit_bias.items():
                _check_int("logit_bias", token_id, low=0)
                _check_float("logit_bias", bias, low=-MAX_LOGIT_BIAS, high=MAX_LOGIT_BIAS)


def _check_int(name: str, value: object, *, low: int | None = None, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequestError(f"'{name}' must be an integer, got {value!r}.", param=name)
    if low is not None and value < low:
        raise InvalidRequestError(f"'{name}' must be >= {low}, got {value}.", param=name)
    if high is not None and value > high:
        raise InvalidRequestError(f"'{name}' must be <= {high}, got {value}.", param=name)


def _check_float(name: str, value: object, *, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequestError(f"'{name}' must be a number, got {value!r}.", param=name)
    below = value <= low if low_open else value < low
    if below or value > high:
        bracket = "(" if low_open else "["
        raise InvalidRequestError(f"'{name}' must be in {bracket}{low}, {high}], got {value}.", param=name)
