"""The synchronous engine core: add / abort / step. One thread drives it (see async_engine.py)."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from localchat.engine.batch import build_batch
from localchat.engine.block_manager import BlockManager
from localchat.engine.config import EngineConfig
from localchat.engine.constraint import TokenMatcher, fill_batch_bitmask
from localchat.engine.detokenizer import Decoder, IncrementalDetokenizer
from localchat.engine.draft_model import DraftModelProposer
from localchat.engine.hybrid_prefix import no_checkpoints_note
from localchat.engine.hybrid_spec import (
    copied_back_outside,
    plan_spec_rows,
    speculation_note,
    start_spec_rows,
)
from localchat.engine.in_flight import StepsInFlight
from localchat.engine.interface import (
    BatchInputs,
    ModelRunner,
    RunnerOutput,
    SchedulerOutput,
    StateCacheSpec,
    TokenLogprobs,
)
from localchat.engine.latency import ITL_BUCKETS_S, TTFT_BUCKETS_S, Histogram
from localchat.engine.outputs import EngineStats, RequestOutput
from localchat.engine.request import FinishReason, ImageInput, Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import Scheduler
from localchat.engine.speculative import Proposer, accept_drafts, average_draft_length, record_outcome
from localchat.engine.state_checkpoints import checkpoint_stats
from localchat.engine.state_slots import StateSlotPool, plan_state_slots, start_state_pool
from localchat.errors import ContextLengthExceededError, InvalidRequestError

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_MIB = 512
STATS_WINDOW_S = 10.0


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Decoder,
        config: EngineConfig,
        *,
        eos_token_ids: list[int],
        model_max_len: int,
        draft_runner: ModelRunner | None = None,
        vocab_size: int | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        """`draft_runner`: the draft model of `--speculative draft`, loaded on the same backend and
        checked to share the tokenizer (localchat/weights/draft_vocab.py); `vocab_size`: the target's
        embedding rows (draft ids past it are never proposed); `proposer`: a proposer built beside the
        runner (`--speculative eagle`: the runner's EAGLE-3 head)."""
        config.validate()
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        wanted = config.max_model_len or model_max_len
        spec = runner.kv_cache_spec
        per_block = spec.bytes_per_block(config.block_size)
        # Hybrid models: one state slot per sequence that may run, taken from the same memory budget.
        state_spec: StateCacheSpec | None = getattr(runner, "state_cache_spec", None)
        if state_spec is not None and state_spec.bytes_per_slot <= 0:
            state_spec = None  # no layer keeps a state: a plain transformer
        if config.kv_cache_mib is not None:
            budget = config.kv_cache_mib * 2**20
        else:
            budget = runner.available_kv_memory() or DEFAULT_KV_CACHE_MIB * 2**20
        num_slots = num_checkpoints = state_bytes = spec_rows = 0
        # Steps in flight (--pp): a checkpoint's copy would have to be ordered against every stage's
        # steps not yet back; not done, so hybrid prefix caching is off there.
        depth = getattr(runner, "steps_in_flight", 1)
        prefix_caching = config.enable_prefix_caching
        if state_spec is not None:
            asked = config.state_checkpoints if prefix_caching and depth == 1 else 0
            per_slot = state_spec.bytes_per_slot
            if not speculation_note(config, runner, state_spec, draft_runner, proposer, 1):
                spec_rows = plan_spec_rows(config, budget, per_slot)  # verify steps' states (hybrid_spec.py)
            room = budget - spec_rows * per_slot
            num_slots, num_checkpoints = plan_state_slots(config.max_num_seqs, asked, room, per_slot)
            state_bytes = (num_slots + num_checkpoints + spec_rows) * per_slot
            budget -= state_bytes
        if config.kv_cache_mib is None:
            # More than every sequence at full length can never be used: don't reserve it.
            useful_tokens = config.max_num_seqs * wanted
            budget = min(budget, -(-useful_tokens // config.block_size) * per_block)
        num_blocks = budget // per_block + 1  # +1: the null block
        if num_blocks < 2:
            raise InvalidRequestError(
                f"The KV cache budget ({budget / 2**20:.1f} MiB) holds no block of {per_block / 2**20:.2f} MiB."
            )
        runner.initialize_kv_cache(num_blocks, config.block_size)
        log.info(
            "KV cache: %d blocks of %d tokens, %s, %.0f MiB",
            num_blocks - 1,
            config.block_size,
            spec.dtype_name or f"{spec.dtype_bytes}-byte elements",
            num_blocks * per_block / 2**20,
        )
        self.state_pool: StateSlotPool | None = None
        self.state_bytes_per_slot = 0
        self.prefix_caching_note = ""
        if state_spec is not None:
            self.state_pool = start_state_pool(
                runner, state_spec, config, num_slots, num_checkpoints, spec_rows
            )
            self.state_bytes_per_slot = state_spec.bytes_per_slot
            if prefix_caching and not num_checkpoints:
                # Reusing cached KV blocks without the recurrent state at that point would be wrong.
                prefix_caching = False
                self.prefix_caching_note = no_checkpoints_note(config, depth)
                log.info("Prefix caching off: %s", self.prefix_caching_note)
        # keep_tails: a finished request's partly filled last block stays a partial-reuse source.
        self.block_manager = BlockManager(
            num_blocks, config.block_size, prefix_caching, keep_tails=True, block_bytes=per_block
        )
        self.scheduler = Scheduler(config, self.block_manager, self.state_pool)
        if num_checkpoints:  # state rows [num_slots, num_slots + num_checkpoints)
            self.scheduler.start_checkpoints(num_slots, num_checkpoints)
        capacity = (num_blocks - 1) * config.block_size
        self.max_model_len = min(wanted, capacity)
        if self.max_model_len < wanted:
            log.warning(
                "max_model_len %d capped to %d tokens: all the KV cache (raise --kv-cache-mib)",
                wanted,
                capacity,
            )
        self.spec_draft_tokens = 0  # draft tokens scored, and of which accepted (engine/speculative.py)
        self.spec_accepted_tokens = 0
        self.sequence_passes = 0  # target passes that produced tokens for a sequence, summed over sequences
        self.speculation_note = speculation_note(
            config, runner, state_spec, draft_runner, proposer, spec_rows
        )
        if self.speculation_note:
            log.warning("Speculative decoding off: %s", self.speculation_note)
        self.scheduler.speculate = config.speculative.enabled and not self.speculation_note
        if self.scheduler.speculate and spec_rows:  # state rows [slots + checkpoints, ... + spec_rows)
            start_spec_rows(self.scheduler, num_slots + num_checkpoints, spec_rows, state_spec)
        self.draft: DraftModelProposer | None = None
        if self.scheduler.speculate and config.speculative.method == "draft":
            assert draft_runner is not None
            self.draft = self._draft_proposer(draft_runner, num_blocks, vocab_size)
            self.scheduler.proposer = self.draft
        self._release: Callable[[str], None] | None = getattr(self.draft, "release", None)
        if self.scheduler.speculate and proposer is not None and self.draft is None:  # eagle, mtp
            self.scheduler.proposer = proposer
            self._release = getattr(proposer, "release", None)
        self.scheduler.max_model_len = self.max_model_len
        # Runners whose model sees a picture's tokens both ways (Gemma 3): chunks must not cut a picture.
        self.scheduler.whole_pictures = bool(getattr(runner, "pictures_both_ways", False))
        # Optional runner hook: static-shape work (CUDA graphs) once the batch and context bounds are known.
        if (prepare := getattr(runner, "prepare_decode_graphs", None)) is not None:
            prepare(config.max_num_seqs, self.max_model_len)
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated) per step
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished_total = 0
        self.requests_failed_total = 0  # of which ended with finish_reason "error"
        self.time_to_first_token = Histogram(TTFT_BUCKETS_S)
        self.inter_token_latency = Histogram(ITL_BUCKETS_S)
        # Runners that take several steps at once (`--pp`: one per stage), each of other sequences.
        self.in_flight = StepsInFlight(self, depth) if isinstance(depth, int) and depth > 1 else None

    # -- requests -----------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        req_id: str | None = None,
        arrival_time: float | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> str:
        """Queue a request. `arrival_time` (time.monotonic()) is when the caller submitted it, for TTFT.
        `images`: pictures whose placeholder tokens are in the prompt (the runner scatters their rows)."""
        if not prompt_token_ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ContextLengthExceededError(len(prompt_token_ids), self.max_model_len)
        req_id = req_id or f"req-{next(self._ids)}"
        if req_id in self.scheduler.requests:
            raise InvalidRequestError(f"Request id {req_id!r} is already in use.")
        request = Request(req_id, list(prompt_token_ids), params, eos_token_ids=self.eos_token_ids)
        request.images = tuple(images)
        if arrival_time is not None:
            request.arrival_time = arrival_time
        if params.constraint is not None:
            request.matcher = params.constraint.new_matcher()
        self._detokenizers[req_id] = IncrementalDetokenizer(
            self.tokenizer,
            stop=params.stop,
            skip_special_tokens=params.skip_special_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        self.scheduler.add_request(request)
        self.prompt_tokens_total += len(prompt_token_ids)
        return req_id

    def abort_request(self, req_id: str) -> RequestOutput | None:
        """Finish a request now; its blocks are free before the next step. None if it already ended."""
        request = self.scheduler.requests.get(req_id)
        if request is None:
            return None
        return self._finish(request, FinishReason.ABORT, "")

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished or (self.in_flight is not None and self.in_flight.busy)

    # -- the step -----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self.in_flight is not None:
            return self.in_flight.step()
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        try:
            batch = self.build_batch(scheduler_output)
            runner_output = self.runner.execute_model(scheduler_output, batch)
        except Exception as exc:  # a failed step must not take the engine down
            return self.fail_step(scheduler_output, exc)
        return self.apply_output(scheduler_output, runner_output)

    def build_batch(self, scheduler_output: SchedulerOutput) -> BatchInputs:
        slots = self.state_pool.slots if self.state_pool is not None else None
        batch = build_batch(scheduler_output, self.scheduler.requests, self.config.block_size, slots)
        assert batch.sampling is not None
        batch.sampling.token_bitmask = self._grammar_bitmask(batch.sample_req_ids)
        if (spec_rows := self.scheduler.spec_rows) is not None:
            batch.state_keep = spec_rows.keep_array(batch)  # a hybrid's verify rows: per-position states
        return batch

    def fail_step(self, scheduler_output: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        req_ids = list(scheduler_output.num_scheduled_tokens)
        log.exception("model step failed; failing its %d requests", len(req_ids))
        requests = self.scheduler.requests  # (without those aborted while the step was in flight)
        failed = [requests[r] for r in req_ids if r in requests]
        failed += copied_back_outside(self.scheduler, scheduler_output)  # (their state may be off)
        # Before any is freed: freeing names a request's blocks for reuse.
        self.scheduler.block_manager.forget_unwritten(failed, scheduler_output.block_step)
        if (checkpoints := self.scheduler.checkpoints) is not None:  # its saves may never have run
            checkpoints.forget_rows({dst for _, dst in scheduler_output.state_copies})
        return [self._fail(request, exc) for request in failed]

    def apply_output(self, scheduler_output: SchedulerOutput, output: RunnerOutput) -> list[RequestOutput]:
        """A step's tokens into its requests (skipping any aborted while the step was in flight)."""
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            request = self.scheduler.requests.get(req_id)
            if request is None:
                continue
            # Draft tokens' K/V count only once accepted (below); the rest are overwritten later.
            request.num_computed_tokens += count - len(request.spec_token_ids)
        outputs: list[RequestOutput] = []
        now = time.monotonic()
        embeddings = output.embeddings or {}
        num_generated = 0
        for req_id, token_ids, token_logprobs in self._rows(output):
            request = self.scheduler.requests[req_id]
            if req_id in embeddings:
                request.embedding = embeddings[req_id]
                outputs.append(self._finish(request, FinishReason.STOP, ""))
                continue
            reason: FinishReason | None = None
            accepted = 0
            grammar_error: str | None = None
            detok = self._detokenizers[req_id]
            delta = ""
            # One token at a time, so that a stop (token, string, grammar, length) inside several
            # accepted tokens ends the output exactly where a one-token step would have.
            while reason is None and grammar_error is None and accepted < len(token_ids):
                token_id = token_ids[accepted]
                request.append_output_token(token_id)
                accepted += 1
                reason = request.check_token_stop(self.max_model_len)
                grammar_error = self._advance_matcher(request, token_id)
                if reason is None and request.matcher is not None and request.matcher.is_finished:
                    reason = FinishReason.STOP  # the grammar is complete: nothing may follow
                delta += detok.push([token_id])
                if detok.stop_hit is not None:
                    request.stop_reason = detok.stop_hit
                    reason = FinishReason.STOP
            token_ids = token_ids[:accepted]
            token_logprobs = token_logprobs[:accepted]
            num_generated += accepted
            self.sequence_passes += 1
            request.num_target_passes += 1
            self._record_latency(request, accepted, now)
            if grammar_error is not None:
                out = self._finish(request, FinishReason.ERROR, delta, token_ids, token_logprobs)
                out.error = grammar_error
                self.requests_failed_total += 1
                outputs.append(out)
            elif reason is not None:
                outputs.append(self._finish(request, reason, delta, token_ids, token_logprobs))
            else:
                outputs.append(self._output(request, token_ids, delta, token_logprobs))
        self._count(num_generated)
        return outputs

    # -- helpers ------------------------------------------------------------------------------------

    def _rows(self, output: RunnerOutput) -> Iterator[tuple[str, list[int], list[TokenLogprobs]]]:
        """(request, tokens it produced, their logprobs) per request. A speculative request's rows
        (one per sampled position, consecutive) collapse to the tokens it keeps (accept_drafts), and
        its accepted drafts' K/V become computed."""
        logprobs = output.logprobs
        i, num_rows = 0, len(output.req_ids)
        while i < num_rows:
            req_id = output.req_ids[i]
            request = self.scheduler.requests.get(req_id)
            if request is None:  # aborted while its step was in flight (no drafts then)
                i += 1
                continue
            drafts = request.spec_token_ids
            if not drafts:
                yield req_id, output.sampled_token_ids[i], logprobs[i] if logprobs is not None else []
                i += 1
                continue
            rows = range(i, i + len(drafts) + 1)
            i += len(rows)
            kept = accept_drafts(drafts, [output.sampled_token_ids[r][0] for r in rows])
            request.spec_token_ids = []
            request.num_computed_tokens += len(kept) - 1
            if (spec_rows := self.scheduler.spec_rows) is not None and self.state_pool is not None:
                spec_rows.accepted(request, self.state_pool.slots.get(req_id), len(drafts), len(kept) - 1)
            record_outcome(request, len(drafts), len(kept) - 1, self.config.speculative.num_tokens)
            self.spec_draft_tokens += len(drafts)
            self.spec_accepted_tokens += len(kept) - 1
            request.spec_draft_tokens += len(drafts)
            request.spec_accepted_tokens += len(kept) - 1
            kept_logprobs = [lp for r in rows[: len(kept)] for lp in logprobs[r]] if logprobs else []
            yield req_id, kept, kept_logprobs

    def _draft_proposer(
        self, draft_runner: ModelRunner, num_blocks: int, vocab_size: int | None
    ) -> DraftModelProposer:
        """The draft's own paged cache: as many tokens as the target's pool, at most what the sequences
        that may speculate at once can fill (the draft's bytes per token are smaller than the target's)."""
        config = self.config
        per_block = draft_runner.kv_cache_spec.bytes_per_block(config.block_size)
        blocks_for_batch = config.speculative.max_batch * -(-self.max_model_len // config.block_size)
        draft_blocks = min(num_blocks - 1, blocks_for_batch) + 1
        log.info(
            "Draft model KV cache: %d blocks of %d tokens, %.0f MiB",
            draft_blocks - 1,
            config.block_size,
            draft_blocks * per_block / 2**20,
        )
        return DraftModelProposer(
            draft_runner,
            num_blocks=draft_blocks,
            block_size=config.block_size,
            max_model_len=self.max_model_len,
            max_batch=config.speculative.max_batch,
            token_limit=vocab_size or 2**62,
            prefill_chunk_size=config.prefill_chunk_size,
            p_min=config.speculative.draft_p_min,
            num_tokens=config.speculative.num_tokens,
        )

    def _grammar_bitmask(self, sample_req_ids: list[str]) -> np.ndarray | None:
        """The step's allowed-token mask, or None when no sampling row has a grammar (no work then)."""
        rows: list[tuple[TokenMatcher, int]] = []
        words = 0
        for row, req_id in enumerate(sample_req_ids):
            request = self.scheduler.requests[req_id]
            constraint = request.sampling_params.constraint
            if request.matcher is not None and constraint is not None:
                rows.append((request.matcher, row))
                words = max(words, constraint.mask_words)
        return fill_batch_bitmask(rows, len(sample_req_ids), words) if rows else None

    @staticmethod
    def _advance_matcher(request: Request, token_id: int) -> str | None:
        """Move the request's grammar past its new token; an error message if the grammar refused it."""
        matcher = request.matcher
        if matcher is None or matcher.accept_token(token_id):
            return None
        return f"The output left its grammar at token {token_id}: {matcher.error or 'rejected'}"

    def _output(
        self, request: Request, token_ids: list[int], delta: str, logprobs: list | None = None
    ) -> RequestOutput:
        return RequestOutput(
            req_id=request.req_id,
            new_token_ids=token_ids,
            text_delta=delta,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            num_output_tokens=request.num_output_tokens,
            logprobs=logprobs or [],
            embedding=request.embedding,
            spec_draft_tokens=request.spec_draft_tokens,
            spec_accepted_tokens=request.spec_accepted_tokens,
            num_target_passes=request.num_target_passes,
        )

    def _finish(
        self,
        request: Request,
        reason: FinishReason,
        delta: str,
        token_ids: list[int] | None = None,
        logprobs: list | None = None,
    ) -> RequestOutput:
        detok = self._detokenizers.pop(request.req_id)
        if reason != FinishReason.STOP or detok.stop_hit is None:
            delta += detok.flush()
        self.scheduler.finish_request(request, reason)
        if self._release is not None:
            self._release(request.req_id)
        self.requests_finished_total += 1
        out = self._output(request, token_ids or [], delta, logprobs)
        out.finished, out.finish_reason, out.stop_reason = True, reason, request.stop_reason
        return out

    def _fail(self, request: Request, exc: Exception) -> RequestOutput:
        out = self._finish(request, FinishReason.ERROR, "")
        out.error = f"The model failed while generating: {type(exc).__name__}: {exc}"
        self.requests_failed_total += 1
        return out

    def _record_latency(self, request: Request, num_tokens: int, now: float) -> None:
        if num_tokens == 0:
            return
        if request.last_token_time is None:
            self.time_to_first_token.observe(now - request.arrival_time)
            num_tokens -= 1
        if num_tokens:  # tokens that came out together share the gap since the previous one
            gap = now - (request.last_token_time or now)
            self.inter_token_latency.observe(gap / num_tokens, num_tokens)
        request.last_token_time = now

    def _count(self, num_generated: int) -> None:
        now = time.monotonic()
        self.generation_tokens_total += num_generated
        self._recent.append((now, num_generated))
        while self._recent and now - self._recent[0][0] > STATS_WINDOW_S:
            self._recent.popleft()

    def stats(self) -> EngineStats:
        now = time.monotonic()
        recent = [(t, n) for t, n in self._recent if now - t <= STATS_WINDOW_S]
        span = (now - recent[0][0]) if len(recent) > 1 else 0.0
        rate = sum(n for _, n in recent[1:]) / span if span > 0 else 0.0
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_used=self.block_manager.num_used_blocks,
            kv_blocks_total=self.block_manager.num_usable_blocks,
            kv_blocks_touched=self.block_manager.num_touched_blocks,
            block_size=self.config.block_size,
            prefix_hit_rate=self.block_manager.prefix_hit_rate,
            num_preemptions=self.scheduler.num_preemptions,
            generation_tokens_per_s=rate,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            requests_finished_total=self.requests_finished_total,
            requests_failed_total=self.requests_failed_total,
            max_model_len=self.max_model_len,
            time_to_first_token=self.time_to_first_token.snapshot(),
            inter_token_latency=self.inter_token_latency.snapshot(),
            state_slots_used=self.state_pool.num_used if self.state_pool is not None else 0,
            state_slots_total=self.state_pool.num_slots if self.state_pool is not None else 0,
            state_bytes_per_slot=self.state_bytes_per_slot,
            prefix_caching_enabled=self.block_manager.enable_prefix_caching,
            **checkpoint_stats(self.scheduler.checkpoints),
            max_num_seqs=self.config.max_num_seqs,
            speculative_method=self.config.speculative.method if self.scheduler.speculate else "off",
            spec_draft_tokens_total=self.spec_draft_tokens,
            spec_accepted_tokens_total=self.spec_accepted_tokens,
            sequence_passes_total=self.sequence_passes,
            spec_draft_length_avg=average_draft_length(
                self.scheduler.running if self.scheduler.speculate else [], self.config.speculative.num_tokens
            ),
            speculative_auto_reason=self.config.speculative.auto_reason,
        )
