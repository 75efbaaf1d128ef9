"""One settings object for the CLI and the server. Every knob has a CLI flag and a `LOCALCHAT_*`
environment variable; a flag given on the command line wins over the environment, which wins over
the default. The README's settings table is checked against `SETTINGS_SPEC` by a test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from localchat.engine.config import EngineConfig
from localchat.engine.speculative import SpeculativeConfig
from localchat.errors import BackendUnavailableError
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


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _meta(
    flags: tuple[str, ...],
    help: str,
    *,
    parse: Callable[[str], Any] = str,
    group: str = "server",
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    action: str | None = None,
    env_aliases: tuple[str, ...] = (),
) -> dict[str, Any]:
    return {
        "flags": flags,
        "help": help,
        "parse": parse,
        "group": group,
        "metavar": metavar,
        "choices": choices,
        "action": action,
        "env_aliases": env_aliases,
    }


def _opt(default: Any, flags: tuple[str, ...], help: str, **kwargs: Any) -> Any:
    return field(default=default, metadata=_meta(flags, help, **kwargs))


@dataclass(slots=True)
class Settings:
    # -- model ---------------------------------------------------------------------------------------
    weights: str | None = _opt(
        None, ("--w", "--weights"), "a safetensors model folder", group="model", metavar="DIR"
    )
    file: str | None = _opt(None, ("--f", "--file"), "a GGUF model file", group="model", metavar="FILE")
    mmproj: str | None = _opt(
        None,
        ("--mmproj",),
        "llama.cpp's vision projector (mmproj-*.gguf) for a GGUF model; without it, the only mmproj*.gguf "
        "beside the model file is paired",
        group="model",
        metavar="FILE",
    )
    model: str | None = _opt(
        None,
        ("--m", "--model"),
        "a models.yaml alias, a Hugging Face repo ORG/REPO[:QUANT] (pulled first if missing) or a local "
        "path; with `chat --url`, the remote model name",
        group="model",
        metavar="NAME",
    )
    embedding_model: str | None = _opt(
        None,
        ("--embedding-model",),
        "an embedding model loaded beside the chat model for /v1/embeddings: a sentence-transformers "
        "folder, a models.yaml alias or ORG/REPO (BERT, XLM-RoBERTa, ModernBERT, Qwen3-Embedding, EmbeddingGemma)",
        group="model",
        metavar="NAME",
    )
    rerank_model: str | None = _opt(
        None,
        ("--rerank-model",),
        "a cross-encoder loaded beside the chat model for /v1/rerank (folder, alias or ORG/REPO)",
        group="model",
        metavar="NAME",
    )
    backend: str = _opt("auto", ("--backend",), "inference backend", group="model", choices=BACKEND_CHOICES)
    device: str = _opt(
        "auto",
        ("--device",),
        "device: auto, cpu, cuda, cuda:N, mps (torch); auto, cpu, gpu (mlx)",
        group="model",
    )
    dtype: str = _opt("auto", ("--dtype",), "compute dtype: auto, float32, bfloat16, float16", group="model")
    threads: int | None = _opt(
        None,
        ("--threads",),
        "CPU compute threads (default: the backend's choice)",
        parse=int,
        group="model",
        metavar="N",
    )
    cuda_graphs: bool = _opt(
        True,
        ("--no-cuda-graphs",),
        "torch on CUDA: run decode steps eagerly instead of replaying captured CUDA graphs",
        parse=_bool,
        group="model",
        action="store_false",
    )
    isq: str | None = _opt(
        None,
        ("--isq",),
        "torch: quantize unquantized (safetensors) weights at load: q4 (torch int4; CUDA, or CPU with "
        "bf16), q8_0 / q4_k / q4_0 (GGUF blocks on localchat's CPU kernels)",
        group="model",
        choices=ISQ_CHOICES,
    )
    kv_cache_dtype: str = _opt(
        "auto",
        ("--kv-cache-dtype",),
        "KV cache element type: auto (the compute dtype), bf16, or int8 (torch: per-token, per-head "
        "scales, about half the memory of bf16)",
        group="model",
        choices=KV_CACHE_DTYPES,
    )
    tensor_parallel_size: int = _opt(
        1,
        ("--tensor-parallel-size", "--tp"),
        "torch: shard each layer across N processes (NCCL on CUDA, gloo on CPU; Llama, Mistral, Qwen2/3, Mixtral, Qwen3-MoE; docs/parallel.md)",
        parse=int,
        group="model",
        metavar="N",
    )
    device_ids: str = _opt(
        "",
        ("--device-ids",),
        "torch with --tensor-parallel-size: the CUDA devices of ranks 0, 1, ... (default 0..N-1)",
        group="model",
        metavar="IDS",
    )
    pipeline_parallel_size: int = _opt(
        1,
        ("--pipeline-parallel-size", "--pp"),
        "torch: split the layers into N contiguous stages, one process each (with --tp, each stage sharded; "
        "NCCL on CUDA, gloo on CPU; also for models --tp cannot split; docs/parallel.md)",
        parse=int,
        group="model",
        metavar="N",
    )
    gpu_layers: int | None = _opt(
        None,
        ("--gpu-layers",),
        "torch: run the last N layers (and the LM head) on the GPU and the rest on the CPU, in one process "
        "(like llama.cpp's --n-gpu-layers)",
        parse=int,
        group="model",
        metavar="N",
    )
    seed: int = _opt(
        0,
        ("--seed",),
        "seed of the generator that unseeded requests draw from",
        parse=int,
        group="model",
        metavar="N",
    )
    # -- server --------------------------------------------------------------------------------------
    host: str = _opt("127.0.0.1", ("--host",), "address to bind; anything but loopback needs --api-key")
    port: int = _opt(8000, ("--p", "--port"), "port to listen on", parse=int, metavar="PORT")
    api_key: str | None = _opt(
        None,
        ("--api-key",),
        "require this key (Bearer, X-Api-Key or cookie) on every route but /health",
        metavar="KEY",
    )
    cors_origins: list[str] = field(
        default_factory=list,
        metadata=_meta(
            ("--cors-origin",),
            "allow web pages from this origin (scheme://host:port) to call the server (repeatable; "
            "env: comma-separated); other origins get 403",
            parse=_list,
            metavar="ORIGIN",
            action="append",
        ),
    )
    allowed_hosts: list[str] = field(
        default_factory=list,
        metadata=_meta(
            ("--allowed-host",),
            "also answer to this Host name (repeatable; env: comma-separated; * for any); on loopback "
            "only localhost, 127.0.0.1 and [::1] are answered (DNS-rebinding guard)",
            parse=_list,
            metavar="HOST",
            action="append",
        ),
    )
    log: str = _opt("info", ("--log",), "log level", choices=LOG_LEVELS)
    ui: bool = _opt(
        True, ("--no-ui",), "serve only the API, without the web UI", parse=_bool, action="store_false"
    )
    open_browser: bool = _opt(
        True, ("--no-browser",), "with --ui-server: do not open a browser", parse=_bool, action="store_false"
    )
    max_body_mib: float = _opt(
        4.0, ("--max-body-mib",), "largest request body accepted (413 beyond)", parse=float, metavar="MIB"
    )
    shutdown_timeout: float = _opt(
        30.0,
        ("--shutdown-timeout",),
        "seconds in-flight requests get to finish on SIGINT/SIGTERM",
        parse=float,
        metavar="S",
    )
    home: str | None = _opt(None, ("--home",), "data directory (models, conversations, logs)", metavar="DIR")
    max_loaded_models: int = _opt(
        1,
        ("--max-loaded-models",),
        "models kept loaded at once; loading one more unloads the least recently used idle one",
        parse=int,
        metavar="N",
    )
    tool_call_parser: str = _opt(
        "auto",
        ("--tool-call-parser",),
        "how the model writes tool calls (auto: from the catalog entry or the chat template)",
        choices=TOOL_CALL_PARSERS,
    )
    mcp_config: str | None = _opt(
        None,
        ("--mcp-config",),
        "an mcp.json (Claude-desktop format); servers marked autoUse offer their tools to chats",
        metavar="FILE",
    )
    mcp_allow_keyless_api: bool = _opt(
        False,
        ("--mcp-allow-keyless-api",),
        "let API requests without an API key run MCP tools (refused by default)",
        parse=_bool,
        action="store_true",
    )
    allow_image_urls: bool = _opt(
        False,
        ("--allow-image-urls",),
        "let chat requests name http(s) image URLs, which the server then fetches (off: no outbound requests)",
        parse=_bool,
        action="store_true",
    )
    allow_local_image_files: bool = _opt(
        False,
        ("--allow-local-image-files",),
        "let chat requests name file:// images on this machine (off: the API reads no local files)",
        parse=_bool,
        action="store_true",
    )
    max_images_per_request: int = _opt(
        8, ("--max-images-per-request",), "most pictures one chat request may carry", parse=int, metavar="N"
    )
    max_image_mib: int = _opt(
        20,
        ("--max-image-mib",),
        "largest image file a chat request may carry, in MiB",
        parse=int,
        metavar="MIB",
    )
    # -- engine --------------------------------------------------------------------------------------
    # Named like the EngineConfig field it sets; --mem and LOCALCHAT_MEM still work (users' scripts).
    kv_cache_mib: int | None = _opt(
        None,
        ("--kv-cache-mib", "--mem"),
        "KV cache size in MiB (default: measured free memory)",
        parse=int,
        group="engine",
        metavar="MIB",
        env_aliases=("LOCALCHAT_MEM",),
    )
    max_num_seqs: int = _opt(
        32, ("--max-num-seqs",), "requests decoded together", parse=int, group="engine", metavar="N"
    )
    max_model_len: int | None = _opt(
        None,
        ("--max-model-len",),
        "context length (default: the model's, capped by --kv-cache-mib)",
        parse=int,
        group="engine",
        metavar="N",
    )
    prefill_chunk_size: int = _opt(
        512,
        ("--prefill-chunk-size",),
        "longest prefill piece per step; 0 disables chunking",
        parse=int,
        group="engine",
        metavar="N",
    )
    speculative: str = _opt(
        "off",
        ("--speculative",),
        "speculative decoding: ngram (draft tokens looked up in the prompt and output), draft (a small "
        "model with the same vocabulary guesses them: --draft-model), eagle (an EAGLE-3 head reading the "
        "target's hidden states: --draft-model FOLDER; torch) or off",
        group="engine",
        metavar="METHOD",
    )
    draft_model: str | None = _opt(
        None,
        ("--draft-model",),
        "the draft model of --speculative draft: a models.yaml name, GGUF file or model folder "
        "(default: the models.yaml entry's draft); with --speculative eagle, the EAGLE-3 head's folder",
        group="engine",
        metavar="NAME|PATH",
    )
    num_speculative_tokens: int = _opt(
        4,
        ("--num-speculative-tokens",),
        "draft tokens per sequence per step with --speculative",
        parse=int,
        group="engine",
        metavar="K",
    )
    max_gen_tokens: int = _opt(
        4096,
        ("--max-gen-tokens",),
        "most tokens one request may generate; the default max_tokens",
        parse=int,
        group="engine",
        metavar="N",
    )
    chat_max_tokens: int = _opt(
        2048,
        ("--chat-max-tokens",),
        "longest answer in the web UI and terminal chat (a conversation's own setting wins)",
        parse=int,
        group="engine",
        metavar="N",
    )
    loop_stop: int = _opt(
        256,
        ("--loop-stop",),
        "end an answer once its last N tokens are one short phrase repeated; 0 disables",
        parse=int,
        group="engine",
        metavar="N",
    )
    max_queue_len: int = _opt(
        256,
        ("--max-queue-len",),
        "requests waiting beyond --max-num-seqs before 503",
        parse=int,
        group="engine",
        metavar="N",
    )
    block_size: int = _opt(
        16, ("--block-size",), "tokens per KV cache block", parse=int, group="engine", metavar="N"
    )
    # Named like the EngineConfig field it sets; --no-prefix-cache and LOCALCHAT_PREFIX_CACHE still work.
    enable_prefix_caching: bool = _opt(
        True,
        ("--no-enable-prefix-caching", "--no-prefix-cache"),
        "disable prefix caching",
        parse=_bool,
        group="engine",
        action="store_false",
        env_aliases=("LOCALCHAT_PREFIX_CACHE",),
    )
    # -- default sampling (a request's own fields win) -----------------------------------------------
    temperature: float | None = _opt(
        None, ("--temperature",), "default temperature", parse=float, group="sampling", metavar="T"
    )
    top_k: int | None = _opt(
        None, ("--top-k",), "default top-k (0 disables)", parse=int, group="sampling", metavar="K"
    )
    top_p: float | None = _opt(
        None, ("--top-p",), "default top-p", parse=float, group="sampling", metavar="P"
    )
    min_p: float | None = _opt(
        None, ("--min-p",), "default min-p", parse=float, group="sampling", metavar="P"
    )
    frequency_penalty: float | None = _opt(
        None,
        ("--frequency-penalty",),
        "default frequency penalty",
        parse=float,
        group="sampling",
        metavar="X",
    )
    presence_penalty: float | None = _opt(
        None, ("--presence-penalty",), "default presence penalty", parse=float, group="sampling", metavar="X"
    )
    repetition_penalty: float | None = _opt(
        None,
        ("--repetition-penalty",),
        "default repetition penalty",
        parse=float,
        group="sampling",
        metavar="X",
    )
    # -- terminal chat -------------------------------------------------------------------------------
    url: str | None = _opt(
        None,
        ("--url",),
        "chat: talk to this OpenAI-compatible base URL instead of a local model",
        group="chat",
        metavar="URL",
    )
    system: str | None = _opt(None, ("--system",), "chat: system prompt", group="chat", metavar="TEXT")
    message: str | None = _opt(
        None, ("--message",), "chat: send one message, print the reply and exit", group="chat", metavar="TEXT"
    )
    plain: bool = _opt(
        False,
        ("--plain",),
        "chat: print plain text, no markdown rendering",
        parse=_bool,
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


@dataclass(frozen=True, slots=True)
class SettingSpec:
    name: str
    flags: tuple[str, ...]
    env: str
    help: str
    default: Any
    group: str
    parse: Callable[[str], Any]
    metavar: str | None
    choices: tuple[str, ...] | None
    action: str | None
    env_aliases: tuple[str, ...] = ()  # older names of `env`, still read (the new name wins)


def _specs() -> tuple[SettingSpec, ...]:
    out = []
    for f in fields(Settings):
        meta = f.metadata
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out.append(
            SettingSpec(
                f.name,
                meta["flags"],
                "LOCALCHAT_" + f.name.upper(),
                meta["help"],
                default,
                meta["group"],
                meta["parse"],
                meta["metavar"],
                meta["choices"],
                meta["action"],
                meta["env_aliases"],
            )
        )
    return tuple(out)


SETTINGS_SPEC = _specs()


@dataclass(frozen=True, slots=True)
class BackendVariable:
    """A torch backend tuning variable (docs/backends.md). Environment only, and read when the backend
    asks rather than once at start-up, so one process (and its tests) can change it between loads."""

    env: str
    default: str
    choices: tuple[str, ...]  # empty: checked where it is used (LOCALCHAT_KERNELS names an ISA)
    noun: str  # "X='v' is not <noun>"
    help: str


BACKEND_VARIABLES: tuple[BackendVariable, ...] = (
    BackendVariable(
        "LOCALCHAT_KERNELS", "auto", (), "an ISA", "the CPU kernels' ISA: auto, off, or one ISA by name"
    ),
    BackendVariable(
        "LOCALCHAT_KERNEL_LAYOUT",
        "auto",
        ("auto", "gguf"),
        "a layout",
        "auto: x16 panels where the ISA has their kernels; gguf: the file's blocks on the portable C reference",
    ),
    BackendVariable(
        "LOCALCHAT_KERNEL_ACTIVATIONS",
        "auto",
        ("auto", "q8", "precise"),
        "an activation mode",
        "how the kernels round activations (auto: precise for small models, q8 for bigger ones)",
    ),
    BackendVariable(
        "LOCALCHAT_TORCH_QUANT",
        "auto",
        ("auto", "int4", "dequant", "copies"),
        "a quantization mode",
        "the torch weight mode for quantized matrices",
    ),
    BackendVariable(
        "LOCALCHAT_DECODE_STEP",
        "fused",
        ("fused", "layers"),
        "a choice",
        "fused: one C call per decode step where it applies; layers: the per-layer path",
    ),
    BackendVariable(
        "LOCALCHAT_TORCH_ATTENTION",
        "auto",
        ("auto", "torch", "triton"),
        "an attention kernel",
        "auto: Triton on CUDA, else the CPU kernels; torch: plain PyTorch",
    ),
    BackendVariable(
        "LOCALCHAT_CUDA_INT4",
        "auto",
        ("auto", "both", "triton", "tinygemm"),
        "a choice",
        "the CUDA 4-bit kernel(s): both forms where memory allows, Triton's, or torch's tinygemm",
    ),
)
_BACKEND_BY_ENV = {v.env: v for v in BACKEND_VARIABLES}


def backend_variable(env: str, environ: Mapping[str, str] | None = None) -> str:
    """One backend variable's value (trimmed, lower case, the default when unset or empty), refused with
    the accepted values when it is not one of them."""
    var = _BACKEND_BY_ENV[env]
    value = (os.environ if environ is None else environ).get(env, "").strip().lower() or var.default
    if var.choices and value not in var.choices:
        raise BackendUnavailableError(
            f"{env}={value!r} is not {var.noun}; use one of {', '.join(var.choices)}."
        )
    return value


def backend_choices(env: str) -> tuple[str, ...]:
    """The values a backend variable accepts (its table entry's)."""
    return _BACKEND_BY_ENV[env].choices
