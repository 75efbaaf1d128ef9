"""What a setting may hold: the choices of the settings that take one, and the checks `Settings.validate`
runs on a loaded settings object (config.py holds the table of settings and how they are read)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SPECULATIVE_METHODS
from localchat.errors import LocalchatError

if TYPE_CHECKING:
    from localchat.config import Settings

BACKEND_CHOICES = ("auto", "torch", "mlx", "fake")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Mirrors localchat.serving.tool_parsers.PARSER_CHOICES (checked by a test; the server is not imported here).
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3", "mistral", "harmony", "json")
ISQ_CHOICES = ("q4", "q8_0", "q4_k", "q4_0")
KV_CACHE_DTYPES = ("auto", "bf16", "int8")
# A context shorter than this cannot hold a chat template, a question and a reply: refused at startup.
MIN_CONTEXT_TOKENS = 256


class SettingsError(LocalchatError):
    """A flag or LOCALCHAT_* variable holds a value we cannot use."""

    status = 400
    type = "invalid_settings"
    code = "invalid_setting"


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def check_settings(s: Settings) -> None:
    """SettingsError naming the flag of the first setting that holds a value we cannot use."""
    for name, allowed in (
        ("backend", BACKEND_CHOICES),
        ("log", LOG_LEVELS),
        ("tool_call_parser", TOOL_CALL_PARSERS),
        ("kv_cache_dtype", KV_CACHE_DTYPES),
        ("speculative", SPECULATIVE_METHODS),
    ):
        if getattr(s, name) not in allowed:
            flag = "--" + name.replace("_", "-")
            raise SettingsError(
                f"{flag} must be one of {', '.join(allowed)}, got {getattr(s, name)!r}.", param=name
            )
    if s.isq is not None and s.isq not in ISQ_CHOICES:
        raise SettingsError(f"--isq must be one of {', '.join(ISQ_CHOICES)}, got {s.isq!r}.", param="isq")
    if s.tensor_parallel_size < 1:
        raise SettingsError(
            f"--tensor-parallel-size must be at least 1, got {s.tensor_parallel_size}.",
            param="tensor_parallel_size",
        )
    if s.pipeline_parallel_size < 1:
        raise SettingsError(
            f"--pipeline-parallel-size must be at least 1, got {s.pipeline_parallel_size}.",
            param="pipeline_parallel_size",
        )
    if s.gpu_layers is not None and s.gpu_layers < 0:
        raise SettingsError(f"--gpu-layers must be >= 0, got {s.gpu_layers}.", param="gpu_layers")
    if not all(part.strip().isdigit() for part in _list(s.device_ids)):
        raise SettingsError(
            f"--device-ids takes GPU numbers like 0,1, got {s.device_ids!r}.", param="device_ids"
        )
    if not 0 <= s.port <= 65535:
        raise SettingsError(f"--port must be in [0, 65535], got {s.port}.", param="port")
    if s.max_body_mib <= 0:
        raise SettingsError("--max-body-mib must be > 0.", param="max_body_mib")
    if s.max_gen_tokens < 1:
        raise SettingsError("--max-gen-tokens must be >= 1.", param="max_gen_tokens")
    if s.chat_max_tokens < 1:
        raise SettingsError("--chat-max-tokens must be >= 1.", param="chat_max_tokens")
    if s.max_images_per_request < 1:
        raise SettingsError("--max-images-per-request must be >= 1.", param="max_images_per_request")
    if s.max_image_mib < 1:
        raise SettingsError("--max-image-mib must be >= 1.", param="max_image_mib")
    if s.loop_stop < 0:
        raise SettingsError("--loop-stop must be >= 0 (0 disables it).", param="loop_stop")
    if s.threads is not None and s.threads < 1:
        raise SettingsError("--threads must be >= 1.", param="threads")
    if s.shutdown_timeout < 0:
        raise SettingsError("--shutdown-timeout must be >= 0.", param="shutdown_timeout")
    if s.max_loaded_models < 1:
        raise SettingsError("--max-loaded-models must be >= 1.", param="max_loaded_models")
    if s.max_model_len is not None and s.max_model_len < MIN_CONTEXT_TOKENS:
        raise SettingsError(
            f"--max-model-len {s.max_model_len} is too short for a chat; the smallest that works is "
            f"--max-model-len {MIN_CONTEXT_TOKENS} (or leave it out to use the model's own).",
            param="max_model_len",
        )
    if s.max_queue_len < 0:
        raise SettingsError("--max-queue-len must be >= 0.", param="max_queue_len")
    if sum(x is not None for x in (s.weights, s.file, s.model)) > 1 and not s.url:
        raise SettingsError("Pass only one of --w/--weights, --f/--file and --m/--model.", param="model")
    try:
        s.engine_config().validate()
    except LocalchatError as exc:
        raise SettingsError(exc.message, param=exc.param) from None
    try:  # a bad default would otherwise fail every request that leaves the field out
        defaults: dict[str, Any] = dict(s.sampling_defaults)
        SamplingParams(**defaults)
    except LocalchatError as exc:
        flag = f"--{(exc.param or 'sampling').replace('_', '-')}"
        raise SettingsError(f"{flag}: {exc.message}", param=exc.param) from None
