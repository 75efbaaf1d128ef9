"""GET /health (no key needed) and GET /metrics (Prometheus text from the engine's stats)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from localchat.engine.latency import HistogramSnapshot
from localchat.server.common import get_models
from localchat.server.openapi import api_operation

_METRICS = (
    # (name, kind, help, value from (stats, ctx))
    ("localchat_requests_running", "gauge", "Requests being decoded.", lambda s, c: s.num_running),
    ("localchat_requests_waiting", "gauge", "Requests waiting for a slot.", lambda s, c: s.num_waiting),
    (
        "localchat_requests_in_flight",
        "gauge",
        "Requests accepted and not finished.",
        lambda s, c: c.engine.num_in_flight,
    ),
    ("localchat_kv_blocks_used", "gauge", "KV cache blocks held by requests.", lambda s, c: s.kv_blocks_used),
    ("localchat_kv_blocks_total", "gauge", "KV cache blocks in the pool.", lambda s, c: s.kv_blocks_total),
    (
        "localchat_kv_blocks_touched",
        "gauge",
        "KV cache blocks ever handed out (on CPU, the part of the pool that is resident).",
        lambda s, c: s.kv_blocks_touched,
    ),
    ("localchat_kv_block_size", "gauge", "Tokens per KV cache block.", lambda s, c: s.block_size),
    (
        "localchat_kv_cache_usage_ratio",
        "gauge",
        "Fraction of KV blocks in use.",
        lambda s, c: s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0,
    ),
    (
        "localchat_prefix_cache_hit_rate",
        "gauge",
        "Fraction of prompt tokens found in the prefix cache.",
        lambda s, c: s.prefix_hit_rate,
    ),
    (
        "localchat_generation_tokens_per_second",
        "gauge",
        "Generated tokens per second, recent window.",
        lambda s, c: s.generation_tokens_per_s,
    ),
    ("localchat_max_model_len", "gauge", "Context length in tokens.", lambda s, c: s.max_model_len),
    (
        "localchat_prompt_tokens_total",
        "counter",
        "Prompt tokens received.",
        lambda s, c: s.prompt_tokens_total,
    ),
    (
        "localchat_generation_tokens_total",
        "counter",
        "Tokens generated.",
        lambda s, c: s.generation_tokens_total,
    ),
    (
        "localchat_requests_finished_total",
        "counter",
        "Requests finished.",
        lambda s, c: s.requests_finished_total,
    ),
    (
        "localchat_requests_failed_total",
        "counter",
        "Requests ended by an error (a failed model step).",
        lambda s, c: s.requests_failed_total,
    ),
    (
        "localchat_preemptions_total",
        "counter",
        "Requests preempted for lack of KV blocks.",
        lambda s, c: s.num_preemptions,
    ),
    (
        "localchat_max_num_seqs",
        "gauge",
        "Most sequences decoded together (--max-num-seqs).",
        lambda s, c: s.max_num_seqs,
    ),
    # Hybrid models (linear-attention layers): their per-sequence state pool; zeros for plain transformers.
    (
        "localchat_state_slots_used",
        "gauge",
        "Recurrent-state slots held by requests (hybrid models).",
        lambda s, c: s.state_slots_used,
    ),
    (
        "localchat_state_slots_total",
        "gauge",
        "Recurrent-state slots in the pool: max_num_seqs, fewer if they would take over half the memory budget.",
        lambda s, c: s.state_slots_total,
    ),
    (
        "localchat_state_bytes_per_slot",
        "gauge",
        "Bytes of recurrent state one sequence holds (hybrid models).",
        lambda s, c: s.state_bytes_per_slot,
    ),
    (
        "localchat_state_checkpoints_used",
        "gauge",
        "Prefix-cache checkpoint slots holding a recurrent state (hybrid models; --state-checkpoints).",
        lambda s, c: s.state_checkpoints_used,
    ),
    (
        "localchat_state_checkpoints_total",
        "gauge",
        "Prefix-cache checkpoint slots (hybrid models): --state-checkpoints, fewer in a small budget.",
        lambda s, c: s.state_checkpoints_total,
    ),
    (
        "localchat_state_checkpoint_saves_total",
        "counter",
        "Recurrent states saved at a block boundary for prefix reuse (hybrid models).",
        lambda s, c: s.state_checkpoint_saves_total,
    ),
    (
        "localchat_state_checkpoint_restores_total",
        "counter",
        "Requests that resumed from a saved recurrent state with its cached blocks (hybrid models).",
        lambda s, c: s.state_checkpoint_restores_total,
    ),
    # Speculative decoding (docs/speculative.md): zeros when it is off.
    (
        "localchat_spec_draft_tokens_total",
        "counter",
        "Draft tokens the model scored (speculative decoding).",
        lambda s, c: s.spec_draft_tokens_total,
    ),
    (
        "localchat_spec_accepted_tokens_total",
        "counter",
        "Draft tokens the model agreed with and kept.",
        lambda s, c: s.spec_accepted_tokens_total,
    ),
    (
        "localchat_spec_acceptance_rate",
        "gauge",
        "Accepted over scored draft tokens, since start.",
        lambda s, c: s.spec_acceptance_rate,
    ),
    (
        "localchat_spec_draft_length_avg",
        "gauge",
        "Draft tokens the running sequences ask for per step now (adapted per sequence; 0 when off).",
        lambda s, c: s.spec_draft_length_avg,
    ),
    (
        "localchat_tokens_per_target_pass",
        "gauge",
        "Tokens a sequence got per pass of the model over it, since start (1 without speculation).",
        lambda s, c: s.tokens_per_target_pass,
    ),
    (
        "localchat_prefix_caching_enabled",
        "gauge",
        "1 when prompt prefixes are reused (hybrid models: with state checkpoints); 0 when turned off.",
        lambda s, c: int(s.prefix_caching_enabled),
    ),
)

_HISTOGRAMS = (
    (
        "localchat_time_to_first_token_seconds",
        "From a request's arrival to its first generated token.",
        lambda s: s.time_to_first_token,
    ),
    (
        "localchat_inter_token_latency_seconds",
        "Time between consecutive generated tokens of a request.",
        lambda s: s.inter_token_latency,
    ),
)


def _histogram_lines(name: str, help_text: str, hist: HistogramSnapshot) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for bound, count in zip(hist.bounds, hist.cumulative, strict=True):
        lines.append(f'{name}_bucket{{le="{bound:g}"}} {count}')
    lines += [
        f'{name}_bucket{{le="+Inf"}} {hist.count}',
        f"{name}_sum {hist.total:.6g}",
        f"{name}_count {hist.count}",
    ]
    return lines


@get("/health", name="health", opt={"public": True})
async def health(request: Request[Any, Any, Any]) -> Response[Any]:
    """200 `ok` when a model is ready; 503 `loading`/`downloading` (with progress), `no_model`, `error`
    or `shutting_down` otherwise. The desktop window polls it while the server gets ready."""
    status, body = get_models(request).health()
    headers = {"Retry-After": "1"} if status == 503 and body["status"] in ("loading", "downloading") else {}
    return Response(body, status_code=status, headers=headers)


@get("/metrics", name="metrics", media_type="text/plain; version=0.0.4", operation_class=api_operation())
async def metrics(request: Request[Any, Any, Any]) -> str:
    models = get_models(request)
    loaded = "# HELP localchat_models_loaded Models loaded.\n# TYPE localchat_models_loaded gauge\n"
    loaded += f"localchat_models_loaded {len(models.loaded)}\n"
    if not models.loaded:
        return loaded  # nothing to measure until a model is ready
    ctx = models.current()
    stats = ctx.engine.stats()
    lines = []
    for name, kind, help_text, value in _METRICS:
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} {kind}",
            f"{name} {float(value(stats, ctx)):g}",
        ]
    chosen_by = "auto" if stats.speculative_auto_reason else "flag"
    lines += [
        "# HELP localchat_speculative_method The speculative decoding method in use (1 on its label).",
        "# TYPE localchat_speculative_method gauge",
        f'localchat_speculative_method{{method="{stats.speculative_method}",chosen_by="{chosen_by}"}} 1',
    ]
    for name, help_text, hist in _HISTOGRAMS:
        lines += _histogram_lines(name, help_text, hist(stats))
    return loaded + "\n".join(lines) + "\n"
