"""Typed, user-facing errors. The server translates them in one place (OpenAI JSON or an HTML partial)."""

from __future__ import annotations


class LocalchatError(Exception):
    """Base for every error a user may see. `status` is the HTTP status the API answers with."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidRequestError(LocalchatError):
    """Bad input: a field out of range, of the wrong type, or inconsistent with another."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class ContextLengthExceededError(InvalidRequestError):
    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_tokens} tokens. Shorten the conversation or start a new chat.",
            param="messages",
        )
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len


class AuthenticationError(LocalchatError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFoundError(LocalchatError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"


class QueueFullError(LocalchatError):
    """The waiting queue is full; the API answers 503 with Retry-After."""

    status = 503
    type = "server_busy"
    code = "queue_full"
    retry_after_s = 1


class ModelLoadError(LocalchatError):
    """A model file or folder cannot be read, or holds something we cannot run."""

    status = 500
    type = "model_load_error"
    code = "model_load_failed"


class UnsupportedArchitectureError(ModelLoadError):
    code = "unsupported_architecture"

    def __init__(self, architecture: str, supported: list[str]) -> None:
        super().__init__(
            f"Model architecture {architecture!r} is not supported. Supported: {', '.join(sorted(supported))}."
        )
        self.architecture = architecture


class BackendUnavailableError(LocalchatError):
    """The requested backend (torch, mlx) is not installed or has no usable device."""

    status = 500
    type = "backend_unavailable"
    code = "backend_unavailable"


class DataDirError(LocalchatError):
    """The data directory (models, conversations) cannot be created or written."""

    status = 500
    type = "server_error"
    code = "data_dir_unusable"


class EngineDeadError(LocalchatError):
    """The engine thread stopped; requests cannot be served until restart."""

    status = 500
    type = "server_error"
    code = "engine_dead"


class ModelFailedError(EngineDeadError):
    """The model can no longer run (a tensor-parallel worker died): unavailable until a restart."""

    status = 503
    code = "model_failed"


class ModelNotReadyError(LocalchatError):
    """The model a request needs is being downloaded or loaded; the API answers 503 with Retry-After."""

    status = 503
    type = "server_busy"
    code = "model_loading"
    retry_after_s = 2


class NoModelError(LocalchatError):
    """No model is on disk and none is being fetched (first start): the UI offers the default model."""

    status = 503
    type = "server_busy"
    code = "no_model"
    retry_after_s = 10


class InsufficientMemoryError(LocalchatError):
    """Loading the model would need more RAM than the machine has free: refused before the OS kills us."""

    status = 507
    type = "server_error"
    code = "insufficient_memory"


class DownloadError(LocalchatError):
    """A model download failed (network, hub answer, file system); the partial file is kept for resume."""

    status = 502
    type = "download_error"
    code = "download_failed"


class OfflineError(DownloadError):
    """The model is not on disk and the hub cannot be reached (no network, or HF_HUB_OFFLINE=1)."""

    status = 503
    code = "offline"


class GatedRepoError(DownloadError):
    status = 403
    code = "gated_repo"

    def __init__(self, repo_id: str, endpoint: str) -> None:
        super().__init__(
            f"{repo_id} is a gated model: accept its licence on the model page ({endpoint}/{repo_id}) while "
            "logged in, then set HF_TOKEN to an access token of that account (or run `hf auth login`) and "
            "pull again.",
            param="model",
        )
        self.repo_id = repo_id


class RepoNotFoundError(ModelNotFoundError):
    """The hub has no such repo (or it is private and the token cannot see it)."""


class UnknownQuantError(ModelNotFoundError):
    code = "unknown_quant"

    def __init__(self, repo_id: str, asked: str, available: list[tuple[str, int]]) -> None:
        listing = ", ".join(f"{quant} ({size / 1e9:.2f} GB)" for quant, size in available) or "none"
        super().__init__(
            f"{repo_id} has no GGUF file for {asked!r}. Available quants: {listing}. "
            f"Pull one with `localchat pull {repo_id}:QUANT`.",
            param="model",
        )
        self.available = available


class NotEnoughDiskSpaceError(DownloadError):
    status = 507
    code = "not_enough_disk_space"

    def __init__(self, directory: str, needed: int, free: int) -> None:
        super().__init__(
            f"Not enough disk space in {directory}: the download needs {needed / 1e9:.2f} GB, "
            f"{free / 1e9:.2f} GB are free. Free some space, or keep models elsewhere by setting HF_HOME "
            "(the Hugging Face cache) to a folder on a bigger disk; localchat's own data moves with --home.",
        )
        self.directory, self.needed, self.free = directory, needed, free


class ChecksumMismatchError(DownloadError):
    code = "checksum_mismatch"

    def __init__(self, file: str, expected: str, actual: str) -> None:
        super().__init__(
            f"{file} arrived corrupted: its sha256 is {actual}, expected {expected}. Nothing was kept; "
            "pull again (if it fails again, the source itself may be broken)."
        )


class DownloadCancelledError(DownloadError):
    """Stopped on request; the partial file stays so the next pull resumes."""

    status = 409
    code = "download_cancelled"


class ModelNotOwnedError(InvalidRequestError):
    """`rm` of files another tool downloaded into the shared cache: refused unless forced."""

    status = 409
    code = "not_downloaded_by_localchat"


class DatabaseSchemaError(LocalchatError):
    """The conversations database cannot be brought to this version's schema (newer, or the upgrade failed)."""

    status = 500
    type = "server_error"
    code = "database_schema"


class ShuttingDownError(LocalchatError):
    """SIGINT/SIGTERM arrived: in-flight requests finish, new ones are turned away."""

    status = 503
    type = "server_busy"
    code = "shutting_down"
    retry_after_s = 5
