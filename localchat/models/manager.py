"""The model manager: the loaded engines of a server, and the one model getting ready.

The server listens before any model is loaded: models are fetched (`localchat.models.pulls`) and loaded on
background threads, one load at a time, while `/health` and the UI show the progress. A request asks
`context_for(name)`: a loaded model answers at once; a local model that is not loaded is loaded and
the request waits (Ollama's behaviour), evicting the least recently used idle model beyond
`--max-loaded-models`; while the start-up model (or one the UI asked for) is still getting ready,
requests get 503 with its progress. Engines are built through `serving.assembly`, never here: no
torch or mlx in this layer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.engine.hybrid_spec import spec_rows_wanted
from localchat.engine.speculative import DEFAULT_MAX_BATCH
from localchat.errors import (
    LocalchatError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NoModelError,
    ShuttingDownError,
)
from localchat.host_memory import mem_available
from localchat.models.catalog import DEFAULT_ALIAS, ResolvedModel
from localchat.models.memory import GIB, MemoryEstimate, check_fits, compute_dtype, draft_bytes, estimate
from localchat.models.pulls import Pulls, pull_progress
from localchat.models.side_memory import SideModelMemory, side_model_memory
from localchat.models.targets import find_local, from_local, list_local, startup_choice
from localchat.serving.assembly import build_context, mcp_hub
from localchat.serving.draft_model import draft_model_name

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.mcp import McpHub
    from localchat.serving.context import ServerContext

log = logging.getLogger(__name__)

Builder = Callable[..., "ServerContext"]  # build_context(settings, target=...) from serving.assembly


@dataclass(slots=True)
class LoadTask:
    name: str
    on_demand: bool  # asked for by a request, which waits for it; else requests get 503 meanwhile
    phase: str = "loading"  # downloading | loading
    pull: Any = None  # the PullJob while downloading
    done: threading.Event = field(default_factory=threading.Event)
    ctx: ServerContext | None = None
    error: LocalchatError | None = None

    def progress(self, phase: str | None = None) -> dict[str, Any]:
        """`phase`: a snapshot the caller already read (the loader thread may move on meanwhile)."""
        if (phase or self.phase) == "downloading":
            if self.pull is None:  # the phase is set just before the pull job starts
                return pull_progress(self.name, "resolving", "Looking the model up…")
            return dict(self.pull.progress)
        return {"phase": "loading", "name": self.name, "message": f"Loading {self.name} into memory…"}

    def describe(self) -> str:
        if self.phase == "downloading":
            percent = self.pull.percent if self.pull is not None else None
            done = f" ({percent}%)" if percent is not None else ""
            return f"Model {self.name!r} is downloading{done}. Retry in a moment."
        return f"Model {self.name!r} is loading. Retry in a moment."


class ModelManager:
    def __init__(
        self,
        settings: Settings,
        *,
        data_dir: Path | None = None,
        build: Builder | None = None,
        available_memory: Callable[[], int | None] | None = None,
        startup_progress: Callable[[Any], None] | None = None,
        mcp: McpHub | bool | None = True,
    ) -> None:
        self.settings = settings
        if data_dir is None and settings.home:
            data_dir = Path(settings.home).expanduser()
        self.data_dir = data_dir  # None: the hub's default (LOCALCHAT_HOME / the platform's data dir)
        self._build = build
        self._available = available_memory or mem_available
        self._startup_progress = startup_progress  # e.g. the CLI's progress bar for `serve --m NAME`
        self.on_startup_error: Callable[[LocalchatError], None] | None = None  # the CLI exits with it
        self._loaded: OrderedDict[str, ServerContext] = OrderedDict()  # least recently used first
        self._estimates: dict[str, MemoryEstimate] = {}
        # The embedding/rerank models beside the chat models: counted in the memory check, never evicted.
        self.side_models: list[SideModelMemory] = []
        self._tasks: dict[str, LoadTask] = {}
        self._startup: LoadTask | None = None
        self._last_error: str | None = None
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()  # one load at a time: the peak is one model's load
        self.draining = False
        # Names of the model the flags gave (--f/--w, a path as --m): not in the hub's store, so after an
        # unload or eviction `load()` finds it here, and builds it from the flags again.
        self._flag_names: set[str] = set()
        self.pulls = Pulls(data_dir)
        # One MCP hub for the server (--mcp-config), shared by every model; True: made from the settings.
        self.mcp: McpHub | None = mcp_hub(settings) if mcp is True else (mcp or None)

    @classmethod
    def preloaded(cls, settings: Settings, ctx: ServerContext, **kwargs: Any) -> ModelManager:
        """A manager that already holds `ctx` (built by the caller); `start()` starts its engine."""
        manager = cls(settings, mcp=ctx.mcp or False, **kwargs)
        manager._loaded[ctx.model_id] = ctx
        return manager

    def count_side_models(self, models: list[tuple[str, str, Path]]) -> None:
        """Size the side models (model id, "embedding" or "rerank", path) from their tensor tables."""
        self.side_models = [side_model_memory(model_id, kind, path) for model_id, kind, path in models]

    # -- life cycle (the app's lifespan) ---------------------------------------------------------------

    def start(self) -> None:
        for ctx in self._loaded.values():
            if not ctx.engine.is_running:
                ctx.engine.start()
        if not self._loaded:
            self._start_startup()

    def shutdown(self, drain_timeout_s: float) -> None:
        """Stop taking requests, cancel pulls (their partial files stay), drain and stop every engine."""
        self.draining = True
        self.pulls.cancel_all()
        with self._lock:
            contexts = list(self._loaded.values())
            self._loaded.clear()
        for ctx in contexts:
            ctx.draining = True
        for ctx in contexts:
            ctx.engine.shutdown(drain_timeout_s)

    # -- what requests see -----------------------------------------------------------------------------

    @property
    def loaded(self) -> list[ServerContext]:
        with self._lock:
            return list(self._loaded.values())

    def current(self) -> ServerContext:
        """The most recently used loaded model (requests that name none get it), else a 503 error."""
        with self._lock:
            if self._loaded:
                return next(reversed(self._loaded.values()))
        raise self._not_ready()

    def lookup(self, name: str | None) -> ServerContext | None:
        """The loaded model `name` means (empty: the current one), marked as just used; else None."""
        with self._lock:
            if not name:
                ctx = next(reversed(self._loaded.values()), None) if self._loaded else None
            else:
                ctx = next((c for c in self._loaded.values() if c.knows_model(name)), None)
            if ctx is not None:
                self._loaded.move_to_end(ctx.model_id)
            return ctx

    async def context_for(self, name: str | None) -> ServerContext:
        """The context serving `name`, loading it first if it is a local model (the request waits)."""
        self.check_accepting()
        if (ctx := self.lookup(name)) is not None:
            return ctx
        if not name:
            raise self._not_ready()
        task = self.load(name, on_demand=True)
        if not task.on_demand:
            raise ModelNotReadyError(task.describe())
        while not task.done.is_set():
            await asyncio.sleep(0.05)
        return self._result(task)

    def ready_context(self, name: str | None) -> ServerContext:
        """Like `context_for` without waiting: the UI shows the loading state and polls instead."""
        self.check_accepting()
        if (ctx := self.lookup(name)) is not None:
            return ctx
        if not name:
            raise self._not_ready()
        raise ModelNotReadyError(self.load(name).describe())

    def check_accepting(self) -> None:
        if self.draining:
            raise ShuttingDownError("The server is shutting down and takes no new requests.")

    def health(self) -> tuple[int, dict[str, Any]]:
        """The /health answer (status code, body); the desktop window and the UI poll it."""
        with self._lock:
            loaded = list(self._loaded.values())
        if self.draining or any(ctx.draining for ctx in loaded):
            return 503, {"status": "shutting_down"}
        with self._lock:
            task = (
                self._startup
                if self._startup in self._tasks.values()
                else next(iter(self._tasks.values()), None)
            )
        if loaded:
            current = loaded[-1]
            if not current.engine.is_running:
                return 503, {"status": "error", "detail": "the engine is not running"}
            if (failure := current.engine.failure) is not None:
                return 503, {"status": "error", "model": current.model_id, "detail": failure}
            return 200, {"status": "ok", "model": current.model_id, "loaded": [c.model_id for c in loaded]}
        if task is not None:
            phase = task.phase  # read once: status and progress must describe the same moment
            status = "downloading" if phase == "downloading" else "loading"
            return 503, {"status": status, "model": task.name, "progress": task.progress(phase)}
        if self._last_error is not None:
            return 503, {"status": "error", "detail": self._last_error}
        detail = self._no_model_detail()
        return 503, {"status": "no_model", "model": None, "default": DEFAULT_ALIAS, "detail": detail}

    def loading(self) -> list[LoadTask]:
        with self._lock:
            return list(self._tasks.values())

    def local_models(self) -> list[Any]:
        return list_local(self.data_dir)

    # -- loading and unloading ---------------------------------------------------------------------------

    def load(self, name: str, *, on_demand: bool = False) -> LoadTask:
        """Start loading the local model `name` (or join its load); a finished task if it is loaded."""
        with self._lock:
            if (ctx := self.lookup(name)) is not None:
                task = LoadTask(name, on_demand, ctx=ctx)
                task.done.set()
                return task
            if (running := self._tasks.get(name)) is not None:
                return running
            target = find_local(name, self.data_dir)
            by_flags = target is None and name in self._flag_names
            if target is None and not by_flags:
                raise self._unknown(name)
            task = self._tasks[name] = LoadTask(name, on_demand)
        self._spawn(task, target, by_flags=by_flags)
        return task

    def fetch_and_load(self, name: str) -> LoadTask:
        """Load `name`, pulling it first when it is not on disk (the UI's first-start "Download")."""
        with self._lock:
            if self.lookup(name) is not None or name in self._tasks or name in self._flag_names:
                return self.load(name)
            target = find_local(name, self.data_dir)
            task = self._tasks[name] = LoadTask(name, on_demand=False)
        self._spawn(task, target)
        return task

    def unload(self, name: str) -> bool:
        """Unload a model; its in-flight requests finish first (blocking: call it off the event loop)."""
        with self._lock:
            ctx = next((c for c in self._loaded.values() if c.knows_model(name)), None)
            if ctx is None:
                return False
            self._drop(ctx)
        ctx.engine.shutdown(self.settings.shutdown_timeout)
        log.info("model %s unloaded", ctx.model_id)
        return True

    def _start_startup(self) -> None:
        try:
            choice = startup_choice(self.settings, self.data_dir)
        except (LocalchatError, OSError) as exc:  # e.g. an unreadable HF cache: say so, keep serving
            self._last_error = getattr(exc, "message", None) or str(exc)
            log.error("choosing the start-up model failed: %s", self._last_error)
            return
        if choice.name is None:
            log.info("no model on disk: the web UI offers %s", DEFAULT_ALIAS)
            return
        with self._lock:
            task = self._startup = self._tasks[choice.name] = LoadTask(choice.name, on_demand=False)
        self._spawn(task, choice.target, by_flags=choice.by_flags)

    def _spawn(self, task: LoadTask, target: ResolvedModel | None, *, by_flags: bool = False) -> None:
        thread = threading.Thread(
            target=self._run, args=(task, target, by_flags), name=f"load-{task.name}", daemon=True
        )
        thread.start()

    def _run(self, task: LoadTask, target: ResolvedModel | None, by_flags: bool) -> None:
        try:
            if target is None and not by_flags:
                target = self._pull(task)
            task.phase = "loading"
            task.ctx = self._load(task.name, target)
            if target is None and by_flags:
                with self._lock:
                    self._flag_names |= {task.name, task.ctx.model_id, *task.ctx.model_aliases}
            self._last_error = None
        except LocalchatError as exc:
            task.error = exc
            self._last_error = exc.message
            # The CLI prints the start-up model's failure itself (on_startup_error): say it once.
            printed = task is self._startup and self.on_startup_error is not None
            (log.debug if printed else log.error)("loading %s failed: %s", task.name, exc.message)
        except Exception as exc:  # a load must fail as a message, never as a dead thread
            log.exception("loading %s failed", task.name)
            task.error = ModelLoadError(f"Loading {task.name!r} failed: {type(exc).__name__}: {exc}")
            self._last_error = task.error.message
        finally:
            with self._lock:
                self._tasks.pop(task.name, None)
            task.done.set()
        if task.error is not None and task is self._startup and self.on_startup_error is not None:
            self.on_startup_error(task.error)

    def _pull(self, task: LoadTask) -> ResolvedModel:
        task.phase = "downloading"
        echo = self._startup_progress if task is self._startup else None
        task.pull = job = self.pulls.start(task.name, echo)
        job.done.wait()
        if job.result is None:
            reason = job.error or "the download was cancelled"
            raise ModelLoadError(f"Downloading {task.name!r} did not finish: {reason}")
        return from_local(job.result)

    def _load(self, name: str, target: ResolvedModel | None) -> ServerContext:
        build = self._build or build_context
        with self._load_lock:
            need = None
            if target is not None:
                st = self.settings
                dtype = compute_dtype(st.dtype, st.device, st.backend)
                need = estimate(
                    target.path,
                    st.kv_cache_mib,
                    st.isq,
                    dtype,
                    st.max_num_seqs,
                    st.backend,
                    st.state_checkpoints,
                    spec_rows_wanted(st.speculative, st.num_speculative_tokens, st.max_num_seqs),
                )
                need = self._with_draft(need, target, dtype)
            victims = self._victims()
            if need is not None:
                freeable = sum(
                    self._estimates[c.model_id].total for c in victims if c.model_id in self._estimates
                )
                check_fits(name, need, self._available(), freeable, self.side_models)
            for ctx in victims:  # in-flight requests on them finish first (shutdown drains)
                with self._lock:
                    self._drop(ctx)
                ctx.engine.shutdown(self.settings.shutdown_timeout)
                log.info("model %s unloaded to make room for %s", ctx.model_id, name)
            ctx = build(self.settings, target=target, mcp=self.mcp)
            if self.draining:
                raise ModelLoadError("The server is shutting down.")
            ctx.engine.start()
        with self._lock:
            self._loaded[ctx.model_id] = ctx
            if need is not None:
                self._estimates[ctx.model_id] = need
        log.info("model %s ready (%d loaded)", ctx.model_id, len(self._loaded))
        return ctx

    def _with_draft(self, need: MemoryEstimate, target: ResolvedModel, dtype: str) -> MemoryEstimate:
        """`need` plus what speculative decoding loads beside the target (models/memory.py `draft_bytes`):
        the draft model (--draft-model, else the entry's `draft`) or the EAGLE-3 head. One not on disk yet
        is pulled by the load itself, and not counted here."""
        st = self.settings
        if st.speculative not in ("draft", "eagle") or st.backend == "fake":
            return need
        name = draft_model_name(st, target, st.speculative)  # --draft-model, else the entry's draft / eagle
        if not name:
            return need  # the load says a draft is needed
        path = Path(name).expanduser()
        if not path.exists():
            local = find_local(name, self.data_dir)
            if local is None:
                return need
            path = local.path
        rows = DEFAULT_MAX_BATCH * st.num_speculative_tokens  # draft_states.py: max_batch x (1 + k - 1)
        draft = draft_bytes(path, st.kv_cache_mib, st.isq, dtype, st.backend, rows, st.speculative == "eagle")
        log.info(
            "RAM estimate for %s: target %.1f GiB + %s %.1f GiB",
            target.model_id,
            need.total / GIB,
            "EAGLE head" if st.speculative == "eagle" else "draft",
            draft / GIB,
        )
        return replace(need, draft=draft)

    def _victims(self) -> list[ServerContext]:
        """Models to unload before one more fits under --max-loaded-models: idle ones first, then LRU."""
        with self._lock:
            excess = len(self._loaded) - max(1, self.settings.max_loaded_models) + 1
            if excess <= 0:
                return []
            order = sorted(self._loaded.values(), key=lambda c: c.engine.num_in_flight > 0)  # stable: LRU
            return order[:excess]

    def _drop(self, ctx: ServerContext) -> None:
        self._loaded.pop(ctx.model_id, None)
        self._estimates.pop(ctx.model_id, None)

    def _result(self, task: LoadTask) -> ServerContext:
        if task.error is not None:
            raise task.error
        assert task.ctx is not None
        return task.ctx

    # -- errors --------------------------------------------------------------------------------------------

    def _not_ready(self) -> LocalchatError:
        with self._lock:
            task = (
                self._startup
                if self._startup in self._tasks.values()
                else next(iter(self._tasks.values()), None)
            )
        if task is not None:
            return ModelNotReadyError(task.describe())
        if self._last_error is not None:
            return ModelLoadError(f"No model is loaded: {self._last_error}")
        return NoModelError(self._no_model_detail())

    def _no_model_detail(self) -> str:
        if any(getattr(m, "complete", True) for m in self.local_models()):
            return "No model is loaded. Load one in the web UI's Models page or with POST /api/models/load."
        return _NO_MODEL

    def _unknown(self, name: str) -> ModelNotFoundError:
        names = sorted(
            {c.model_id for c in self._loaded.values()} | {str(m.name) for m in self.local_models()}
        )
        listed = ", ".join(repr(n) for n in names) or "none yet"
        return ModelNotFoundError(
            f"The model {name!r} does not exist on this server. Available: {listed} (see GET /v1/models). "
            f"Download others with `localchat pull NAME` or POST /api/models/pull.",
            param="model",
        )


_NO_MODEL = (
    f"No model is on this machine yet. Download one in the web UI's Models page, or run "
    f"`localchat pull {DEFAULT_ALIAS}` (the small default model)."
)
