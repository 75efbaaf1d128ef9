"""One settings object for the CLI and the server. Every knob has a CLI flag and a `LOCALCHAT_*`
environment variable; a flag given on the command line wins over the environment, which wins over
the default. The README's settings table is checked against `SETTINGS_SPEC` by a test. The torch
backend's seven tuning variables (environment only) have their table in backend_settings.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localchat.backend_settings import (
    BACKEND_VARIABLES,
    BackendVariable,
    backend_choices,
    backend_variable,
    resolve_backend_variables,
)
from localchat.engine.config import DEFAULT_STATE_CHECKPOINTS, EngineConfig
from localchat.engine.speculative import SpeculativeConfig
from localchat.loopback import is_loopback_host
from localchat.settings_rules import (
    BACKEND_CHOICES,
    ISQ_CHOICES,
    KV_CACHE_DTYPES,
    LOG_LEVELS,
    TOOL_CALL_PARSERS,
    SettingsError,
    check_settings,
)
from localchat.settings_spec import SettingSpec, opt, parse_bool, parse_list, setting_meta, settings_specs

__all__ = [
    "BACKEND_CHOICES",
    "BACKEND_VARIABLES",
    "ISQ_CHOICES",
    "KV_CACHE_DTYPES",
    "LOG_LEVELS",
    "SETTINGS_SPEC",
    "TOOL_CALL_PARSERS",
    "BackendVariable",
    "SettingSpec",
    "Settings",
    "SettingsError",
    "backend_choices",
    "backend_variable",
    "resolve_backend_variables",
]


@dataclass(slots=True)
class Settings:
    # -- model ---------------------------------------------------------------------------------------
    weights: str | None = opt(
        None, ("--w", "--weights"), "a safetensors model folder", group="model", metavar="DIR"
    )
    file: str | None = opt(None, ("--f", "--file"), "a GGUF model file", group="model", metavar="FILE")
    mmproj: str | None = opt(
        None,
        ("--mmproj",),
        "llama.cpp's vision projector (mmproj-*.gguf) for a GGUF model; without it, the only mmproj*.gguf "
        "beside the model file is paired",
        group="model",
        metavar="FILE",
    )
    model: str | None = opt(
        None,
        ("--m", "--model"),
        "a models.yaml alias, a Hugging Face repo ORG/REPO[:QUANT] (pulled first if missing) or a local "
        "path; with `chat --url`, the remote model name",
        group="model",
        metavar="NAME",
    )
    embedding_model: str | None = opt(
        None,
        ("--embedding-model",),
        "an embedding model loaded beside the chat model for /v1/embeddings: a sentence-transformers "
        "folder, a bert / nomic-bert .gguf, a models.yaml alias or ORG/REPO (BERT, XLM-RoBERTa, nomic-bert, "
        "ModernBERT, Qwen3-Embedding, EmbeddingGemma)",
        group="model",
        metavar="NAME",
    )
    rerank_model: str | None = opt(
        None,
        ("--rerank-model",),
        "a cross-encoder loaded beside the chat model for /v1/rerank (folder, alias or ORG/REPO)",
        group="model",
        metavar="NAME",
    )
    backend: str = opt("auto", ("--backend",), "inference backend", group="model", choices=BACKEND_CHOICES)
    device: str = opt(
        "auto",
        ("--device",),
        "device: auto, cpu, cuda, cuda:N, mps (torch); auto, cpu, gpu (mlx)",
        group="model",
    )
    dtype: str = opt("auto", ("--dtype",), "compute dtype: auto, float32, bfloat16, float16", group="model")
    threads: int | None = opt(
        None,
        ("--threads",),
        "CPU compute threads (default: the backend's choice)",
        parse=int,
        group="model",
        metavar="N",
    )
    cuda_graphs: bool = opt(
        True,
        ("--no-cuda-graphs",),
        "torch on CUDA: run decode steps eagerly instead of replaying captured CUDA graphs",
        parse=parse_bool,
        group="model",
        action="store_false",
    )
    isq: str | None = opt(
        None,
        ("--isq",),
        "torch: quantize unquantized (safetensors) weights at load: q4 (torch int4; CUDA, or CPU with "
        "bf16), q8_0 / q4_k / q4_0 (GGUF blocks on localchat's CPU kernels)",
        group="model",
        choices=ISQ_CHOICES,
    )
    kv_cache_dtype: str = opt(
        "auto",
        ("--kv-cache-dtype",),
        "KV cache element type: auto (the compute dtype), bf16, or int8 (torch: per-token, per-head "
        "scales, about half the memory of bf16)",
        group="model",
        choices=KV_CACHE_DTYPES,
    )
    tensor_parallel_size: int = opt(
        1,
        ("--tensor-parallel-size", "--tp"),
        "torch: shard each layer across N processes (NCCL on CUDA, gloo on CPU; every family localchat runs; "
        "docs/parallel.md)",
        parse=int,
        group="model",
        metavar="N",
    )
    device_ids: str = opt(
        "",
        ("--device-ids",),
        "torch with --tensor-parallel-size: the CUDA devices of ranks 0, 1, ... (default 0..N-1)",
        group="model",
        metavar="IDS",
    )
    pipeline_parallel_size: int = opt(
        1,
        ("--pipeline-parallel-size", "--pp"),
        "torch: split the layers into N contiguous stages, one process each (with --tp, each stage sharded; "
        "NCCL on CUDA, gloo on CPU; also for models --tp cannot split; docs/parallel.md)",
        parse=int,
        group="model",
        metavar="N",
    )
    gpu_layers: int | None = opt(
        None,
        ("--gpu-layers",),
        "torch: run the last N layers (and the LM head) on the GPU and the rest on the CPU, in one process "
        "(like llama.cpp's --n-gpu-layers)",
        parse=int,
        group="model",
        metavar="N",
    )
    seed: int = opt(
        0,
        ("--seed",),
        "seed of the generator that unseeded requests draw from",
        parse=int,
        group="model",
        metavar="N",
    )
    # -- server --------------------------------------------------------------------------------------
    host: str = opt("127.0.0.1", ("--host",), "address to bind; anything but loopback needs --api-key")
    port: int = opt(8000, ("--p", "--port"), "port to listen on", parse=int, metavar="PORT")
    api_key: str | None = opt(
        None,
        ("--api-key",),
        "require this key (Bearer, X-Api-Key or cookie) on every route but /health",
        metavar="KEY",
    )
    cors_origins: list[str] = field(
        default_factory=list,
        metadata=setting_meta(
            ("--cors-origin",),
            "allow web pages from this origin (scheme://host:port) to call the server (repeatable; "
            "env: comma-separated); other origins get 403",
            parse=parse_list,
            metavar="ORIGIN",
            action="append",
        ),
    )
    allowed_hosts: list[str] = field(
        default_factory=list,
        metadata=setting_meta(
            ("--allowed-host",),
            "also answer to this Host name (repeatable; env: comma-separated; * for any); on loopback "
            "only localhost, 127.0.0.1 and [::1] are answered (DNS-rebinding guard)",
            parse=parse_list,
            metavar="HOST",
            action="append",
        ),
    )
    log: str = opt("info", ("--log",), "log level", choices=LOG_LEVELS)
    ui: bool = opt(
        True, ("--no-ui",), "serve only the API, without the web UI", parse=parse_bool, action="store_false"
    )
    open_browser: bool = opt(
        True,
        ("--no-browser",),
        "with --ui-server: do not open a browser",
        parse=parse_bool,
        action="store_false",
    )
    max_body_mib: float = opt(
        4.0, ("--max-body-mib",), "largest request body accepted (413 beyond)", parse=float, metavar="MIB"
    )
    shutdown_timeout: float = opt(
        30.0,
        ("--shutdown-timeout",),
        "seconds in-flight requests get to finish on SIGINT/SIGTERM",
        parse=float,
        metavar="S",
    )
    home: str | None = opt(None, ("--home",), "data directory (models, conversations, logs)", metavar="DIR")
    max_loaded_models: int = opt(
        1,
        ("--max-loaded-models",),
        "models kept loaded at once; loading one more unloads the least recently used idle one",
        parse=int,
        metavar="N",
    )
    tool_call_parser: str = opt(
        "auto",
        ("--tool-call-parser",),
        "how the model writes tool calls (auto: from the catalog entry or the chat template)",
        choices=TOOL_CALL_PARSERS,
    )
    mcp_config: str | None = opt(
        None,
        ("--mcp-config",),
        "an mcp.json (Claude-desktop format); servers marked autoUse offer their tools to chats",
        metavar="FILE",
    )
    mcp_allow_keyless_api: bool = opt(
        False,
        ("--mcp-allow-keyless-api",),
        "let API requests without an API key run MCP tools (refused by default)",
        parse=parse_bool,
        action="store_true",
    )
    allow_image_urls: bool = opt(
        False,
        ("--allow-image-urls",),
        "let chat requests name http(s) image URLs, which the server then fetches (off: no outbound requests)",
        parse=parse_bool,
        action="store_true",
    )
    allow_local_image_files: bool = opt(
        False,
        ("--allow-local-image-files",),
        "let chat requests name file:// images on this machine (off: the API reads no local files)",
        parse=parse_bool,
        action="store_true",
    )
    max_images_per_request: int = opt(
        8, ("--max-images-per-request",), "most pictures one chat request may carry", parse=int, metavar="N"
    )
    max_image_mib: int = opt(
        20,
        ("--max-image-mib",),
        "largest image file a chat request may carry, in MiB",
        parse=int,
        metavar="MIB",
    )
    # -- engine --------------------------------------------------------------------------------------
    # Named like the EngineConfig field it sets; --mem and LOCALCHAT_MEM still work (users' scripts).
    kv_cache_mib: int | None = opt(
        None,
        ("--kv-cache-mib", "--mem"),
        "KV cache size in MiB (default: measured free memory)",
        parse=int,
        group="engine",
        metavar="MIB",
        env_aliases=("LOCALCHAT_MEM",),
    )
    max_num_seqs: int = opt(
        32, ("--max-num-seqs",), "requests decoded together", parse=int, group="engine", metavar="N"
    )
    max_model_len: int | None = opt(
        None,
        ("--max-model-len",),
        "context length (default: the model's, capped by --kv-cache-mib)",
        parse=int,
        group="engine",
        metavar="N",
    )
    prefill_chunk_size: int = opt(
        512,
        ("--prefill-chunk-size",),
        "longest prefill piece per step; 0 disables chunking",
        parse=int,
        group="engine",
        metavar="N",
    )
    speculative: str = opt(
        "off",
        ("--speculative",),
        "speculative decoding: ngram (draft tokens looked up in the prompt and output), draft (a small "
        "model with the same vocabulary guesses them: --draft-model), eagle (an EAGLE-3 head reading the "
        "target's hidden states: --draft-model FOLDER; torch), mtp (the model's own multi-token-prediction "
        "head: Qwen3.5 / Qwen3-Next folders and GGUFs, GLM-4.5 folders; torch, and MLX for Qwen), auto (picked per model and device at load: mtp when "
        "the checkpoint ships the head, ngram for models of 1B parameters or more on CPU, else off) or off",
        group="engine",
        metavar="METHOD",
    )
    draft_model: str | None = opt(
        None,
        ("--draft-model",),
        "the draft model of --speculative draft: a models.yaml name, GGUF file or model folder "
        "(default: the models.yaml entry's draft); with --speculative eagle, the EAGLE-3 head's folder",
        group="engine",
        metavar="NAME|PATH",
    )
    num_speculative_tokens: int = opt(
        4,
        ("--num-speculative-tokens",),
        "draft tokens per sequence per step with --speculative",
        parse=int,
        group="engine",
        metavar="K",
    )
    max_gen_tokens: int = opt(
        4096,
        ("--max-gen-tokens",),
        "most tokens one request may generate; the default max_tokens",
        parse=int,
        group="engine",
        metavar="N",
    )
    chat_max_tokens: int = opt(
        2048,
        ("--chat-max-tokens",),
        "longest answer in the web UI and terminal chat (a conversation's own setting wins)",
        parse=int,
        group="engine",
        metavar="N",
    )
    loop_stop: int = opt(
        256,
        ("--loop-stop",),
        "end an answer once its last N tokens are one short phrase repeated; 0 disables",
        parse=int,
        group="engine",
        metavar="N",
    )
    max_queue_len: int = opt(
        256,
        ("--max-queue-len",),
        "requests waiting beyond --max-num-seqs before 503",
        parse=int,
        group="engine",
        metavar="N",
    )
    block_size: int = opt(
        16, ("--block-size",), "tokens per KV cache block", parse=int, group="engine", metavar="N"
    )
    # Named like the EngineConfig field it sets; --no-prefix-cache and LOCALCHAT_PREFIX_CACHE still work.
    enable_prefix_caching: bool = opt(
        True,
        ("--no-enable-prefix-caching", "--no-prefix-cache"),
        "disable prefix caching",
        parse=parse_bool,
        group="engine",
        action="store_false",
        env_aliases=("LOCALCHAT_PREFIX_CACHE",),
    )
    state_checkpoints: int = opt(
        DEFAULT_STATE_CHECKPOINTS,
        ("--state-checkpoints",),
        "hybrid models: recurrent states kept for prefix caching (0: no prefix caching for them)",
        parse=int,
        group="engine",
        metavar="N",
    )
    # -- default sampling (a request's own fields win) -----------------------------------------------
    temperature: float | None = opt(
        None, ("--temperature",), "default temperature", parse=float, group="sampling", metavar="T"
    )
    top_k: int | None = opt(
        None, ("--top-k",), "default top-k (0 disables)", parse=int, group="sampling", metavar="K"
    )
    top_p: float | None = opt(None, ("--top-p",), "default top-p", parse=float, group="sampling", metavar="P")
    min_p: float | None = opt(None, ("--min-p",), "default min-p", parse=float, group="sampling", metavar="P")
    frequency_penalty: float | None = opt(
        None,
        ("--frequency-penalty",),
        "default frequency penalty",
        parse=float,
        group="sampling",
        metavar="X",
    )
    presence_penalty: float | None = opt(
        None, ("--presence-penalty",), "default presence penalty", parse=float, group="sampling", metavar="X"
    )
    repetition_penalty: float | None = opt(
        None,
        ("--repetition-penalty",),
        "default repetition penalty",
        parse=float,
        group="sampling",
        metavar="X",
    )
    # -- terminal chat -------------------------------------------------------------------------------
    url: str | None = opt(
        None,
        ("--url",),
        "chat: talk to this OpenAI-compatible base URL instead of a local model",
        group="chat",
        metavar="URL",
    )
    system: str | None = opt(None, ("--system",), "chat: system prompt", group="chat", metavar="TEXT")
    message: str | None = opt(
        None, ("--message",), "chat: send one message, print the reply and exit", group="chat", metavar="TEXT"
    )
    plain: bool = opt(
        False,
        ("--plain",),
        "chat: print plain text, no markdown rendering",
        parse=parse_bool,
        group="chat",
        action="store_true",
    )

    # -- derived -------------------------------------------------------------------------------------

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)  # by address: 127.0.0.2 is loopback too

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mib * 2**20)

    @property
    def sampling_defaults(self) -> dict[str, float | int]:
        names = (
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            block_size=self.block_size,
            kv_cache_mib=self.kv_cache_mib,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            prefill_chunk_size=self.prefill_chunk_size,
            enable_prefix_caching=self.enable_prefix_caching,
            state_checkpoints=self.state_checkpoints,
            max_queue_len=self.max_queue_len,
            speculative=SpeculativeConfig(self.speculative, self.num_speculative_tokens),
        )

    def validate(self) -> Settings:
        check_settings(self)
        return self

    @classmethod
    def load(cls, cli: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
        """Flags given on the command line (`cli`, only the ones the user typed), then LOCALCHAT_* vars."""
        cli = cli or {}
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for spec in SETTINGS_SPEC:
            if spec.name in cli:
                values[spec.name] = cli[spec.name]
            elif env := next((e for e in (spec.env, *spec.env_aliases) if e in environ), None):
                try:
                    values[spec.name] = spec.parse(environ[env])
                except ValueError as exc:
                    raise SettingsError(
                        f"{env}={environ[env]!r} is not valid: {exc}", param=spec.name
                    ) from None
        return cls(**values).validate()


SETTINGS_SPEC = settings_specs(Settings)
