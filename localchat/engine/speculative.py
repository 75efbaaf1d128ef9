"""Speculative decoding, model-agnostic: a proposer guesses up to k next tokens of a running sequence,
the target model scores them in the same step as extra query rows of that sequence (like a short
prefill chunk after its last token), and the engine keeps the longest prefix the target agrees with.

Acceptance without any runner change: every position of a speculative row is sampled as its own
sampling row (its own penalties context and seed index), giving one target token per position. A draft
token is kept while it equals the target's token there; the first mismatch is replaced by the target's
token, and when all k are kept the target's token after them is a bonus. For greedy rows that is
exactly non-speculative greedy. For sampled rows with a deterministic proposer (q one-hot at the draft
d) it is exactly the standard rejection rule: P(accept d) = p(d) = min(1, p(d)/q(d)), and the token
drawn on rejection is p conditioned on "not d", i.e. norm(max(0, p - q)). A proposer with a real
distribution q would need the runner to see q; the draft model (engine/draft_model.py) proposes
greedily, so its q is one-hot too and the same rule is exact.

Proposers: `NgramProposer` here, `DraftModelProposer` in engine/draft_model.py, and the EAGLE-3 head's
(backends/torch/eagle3_proposer.py; the engine is handed it). The scheduler asks one
per step for every sequence that may speculate, all at once (a draft model batches them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from localchat.engine.request import Request
from localchat.errors import InvalidRequestError

log = logging.getLogger(__name__)

# mtp: the checkpoint's own multi-token-prediction head (backends/torch/mtp_proposer.py)
SPECULATIVE_METHODS = ("off", "ngram", "draft", "eagle", "mtp", "auto")  # auto: speculative_auto.py
# Speculate only while at most this many sequences run. Decode is memory-bound: one step streams every
# weight once whatever its row count, so a few extra query rows per sequence are nearly free at small
# batch sizes. With many sequences the step turns compute-bound, and rejected rows then cost real time
# while batching already keeps the hardware busy.
DEFAULT_MAX_BATCH = 4
# llama.cpp's default for its --draft-p-min. On the 2-core box with the Qwen2.5-Coder pair it is what
# turned the draft from a loss into a win (docs/speculative.md).
DEFAULT_DRAFT_P_MIN = 0.75


# After n draft runs in a row with nothing kept, a sequence proposes nothing for min(2**n, this) steps:
# an answer that does not repeat its context stops paying for wrong guesses (chat: 0.89x -> see
# docs/speculative.md), while one that starts copying is found again within a few steps.
MAX_PAUSE_STEPS = 16


def pause_after(misses: int) -> int:
    """Steps to skip proposing after `misses` consecutive draft runs that were all rejected."""
    return 0 if misses <= 0 else min(2**misses, MAX_PAUSE_STEPS)


# Adaptive draft length per sequence: a step that kept under half of its drafts is "low"; after this many
# low steps in a row K shrinks by one per further low step (down to 1), and a step that kept every draft
# grows it back by one (up to the configured k). Rejected rows cost compute; a sequence whose guesses
# land only a token or two deep stops paying for the rest of the run.
SHRINK_AFTER_LOW_STEPS = 2


def record_outcome(request: Request, drafted: int, accepted: int, k_max: int) -> None:
    """After a verification step of `drafted` drafts of which `accepted` were kept: the sequence's
    backoff (misses, pause: `pause_after`) and its adaptive draft length `request.spec_k`."""
    request.spec_misses = 0 if accepted else request.spec_misses + 1
    request.spec_pause = pause_after(request.spec_misses)
    k = request.spec_k or k_max
    if accepted >= drafted:
        request.spec_low = 0
        k += 1
    elif 2 * accepted < drafted:
        request.spec_low += 1
        if request.spec_low >= SHRINK_AFTER_LOW_STEPS:
            k -= 1
    else:
        request.spec_low = 0
    request.spec_k = max(1, min(k_max, k))


def draft_length(request: Request, k_max: int) -> int:
    """The draft length this sequence asks for now (`record_outcome` adapts it)."""
    return min(request.spec_k or k_max, k_max)


def average_draft_length(requests: Sequence[Request], k_max: int) -> float:
    """The mean draft length the running sequences ask for now, for /metrics (0 with none)."""
    return sum(draft_length(r, k_max) for r in requests) / len(requests) if requests else 0.0


@dataclass(slots=True)
class SpeculativeConfig:
    # "off", "ngram" (prompt lookup), "draft" (a draft model the engine is given), "eagle" (an EAGLE-3
    # head reading the target's hidden states: backends/torch/eagle3_proposer.py, given as a proposer) or
    # "mtp" (the checkpoint's own MTP head, the same way: backends/torch/mtp_proposer.py)
    method: str = "off"
    num_tokens: int = 4  # k: draft tokens per sequence per step
    max_batch: int = DEFAULT_MAX_BATCH
    ngram_max: int = 4  # longest suffix matched against earlier tokens
    ngram_min: int = 2  # shortest
    # Draft model: stop a sequence's drafts at the first guess the draft gives less than this
    # probability (engine/draft_model.py); 0 always drafts k.
    draft_p_min: float = DEFAULT_DRAFT_P_MIN
    # Set when `auto` picked `method` at load (speculative_auto.py): why, for the log and /metrics.
    auto_reason: str = ""

    @property
    def enabled(self) -> bool:
        # An unresolved `auto` (an engine built without speculative_auto.resolve_auto) stays off.
        return self.method not in ("off", "auto") and self.num_tokens > 0

    def validate(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise InvalidRequestError(
                f"speculative must be one of {', '.join(SPECULATIVE_METHODS)}, not {self.method!r}",
                param="speculative",
            )
        if not 0 <= self.num_tokens <= 16:
            raise InvalidRequestError("num_speculative_tokens must be between 0 and 16")
        if not 0.0 <= self.draft_p_min < 1.0:
            raise InvalidRequestError("draft_p_min must be in [0, 1)")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise InvalidRequestError("need 1 <= ngram_min <= ngram_max")


def propose_ngram(tokens: Sequence[int], k: int, ngram_max: int = 4, ngram_min: int = 2) -> list[int]:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens (longest n
    first) and propose the up to `k` tokens that followed it. Deterministic; [] when nothing matches."""
    size = len(tokens)
    if k <= 0 or size < ngram_min + 1:
        return []
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        suffix = list(tokens[size - n :])
        first = suffix[0]
        # Latest match first: recent context predicts the continuation best (an edited code block).
        for start in range(size - n - 1, -1, -1):
            if tokens[start] == first and list(tokens[start : start + n]) == suffix:
                follow = list(tokens[start + n : start + n + k])
                if follow:
                    return follow
    return []


def accept_drafts(drafts: Sequence[int], target: Sequence[int]) -> list[int]:
    """The tokens a speculative row commits: drafts while the target's token at each position agrees,
    then the target's own token at the first disagreement (or after the last draft)."""
    assert len(target) == len(drafts) + 1
    out: list[int] = []
    for draft, token in zip(drafts, target, strict=False):
        out.append(token)
        if token != draft:
            return out
    out.append(target[len(drafts)])
    return out


class Proposer(Protocol):
    def propose(self, wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        """Up to k draft tokens for each (request, k); requests left out get none. `live`: the ids of
        every request the engine holds (a stateful proposer frees what the others left behind)."""
        ...


def propose_safely(
    proposer: Proposer, wanted: list[tuple[Request, int]], live: set[str]
) -> dict[str, list[int]]:
    """The proposer's drafts, or none when it raises: a proposer that fails (a draft model's or an
    EAGLE head's pass on a lost device) costs the step its drafts and never the engine (proposing runs
    inside scheduling, outside the step's error handling). The draft model also cleans up its own pool
    (engine/draft_model.py)."""
    try:
        return proposer.propose(wanted, live)
    except Exception:
        log.exception("proposing draft tokens failed; this step decodes without drafts")
        for request, _ in wanted:
            request.spec_draft_probs = None
        return {}


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def propose(self, wanted: list[tuple[Request, int]], live: set[str]) -> dict[str, list[int]]:
        spec = self.config
        return {
            request.req_id: propose_ngram(request.all_token_ids, k, spec.ngram_max, spec.ngram_min)
            for request, k in wanted
        }
