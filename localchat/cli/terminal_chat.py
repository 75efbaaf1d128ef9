"""`localchat chat`: a terminal chat that streams replies and renders markdown (with rich), talking to
the local engine in-process or, with `--url`, to any OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import json
import queue
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from localchat.cli.chat_commands import HINT, ChatSession, Messages, message_text, parse_command, run_command
from localchat.engine.loop_guard import LOOP_NOTE, LOOP_STOP_REASON
from localchat.errors import LocalchatError
from localchat.serving.harmony import HarmonySplitter
from localchat.serving.reasoning import ReasoningSplitter, starts_in_reasoning

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.serving.context import ServerContext


class ChatError(LocalchatError):
    status = 502
    type = "chat_error"
    code = "chat_failed"


class Backend(Protocol):
    def stream(self, messages: Messages) -> Iterator[str]: ...

    def close(self) -> None: ...


class RemoteBackend:
    """Streams from `<url>/chat/completions`; `url` is a base URL like the openai SDK's (".../v1")."""

    def __init__(self, settings: Settings) -> None:
        self.url = settings.url.rstrip("/") + "/chat/completions"  # type: ignore[union-attr]
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(10.0, read=600.0))
        self.body: dict[str, Any] = {"model": settings.model or "", **settings.sampling_defaults}

    def stream(self, messages: Messages) -> Iterator[str]:
        body = {**self.body, "messages": messages, "stream": True}
        try:
            with self.client.stream("POST", self.url, json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise ChatError(
                        f"{self.url} answered {response.status_code}: {_error_text(response.text)}"
                    )
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield from _delta_texts(json.loads(data))
        except httpx.HTTPError as exc:
            raise ChatError(f"Cannot reach {self.url}: {exc}") from exc

    def close(self) -> None:
        self.client.close()


def _error_text(body: str) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:300]


def _delta_texts(chunk: dict[str, Any]) -> Iterator[str]:
    if "error" in chunk:
        raise ChatError(chunk["error"].get("message", "the server reported an error"))
    for choice in chunk.get("choices") or []:
        if content := (choice.get("delta") or {}).get("content"):
            yield content


class LocalBackend:
    """The engine in this process: same templates and sampling defaults as the server."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        ctx.engine.start()

    def stream(self, messages: Messages) -> Iterator[str]:
        from localchat.serving.generation import build_params, resolve_chat_max_tokens
        from localchat.serving.schemas import ChatCompletionRequest, ChatMessage

        ctx = self.ctx
        prompt_text, ids = ctx.chat_tokens(messages)
        req = ChatCompletionRequest(messages=[ChatMessage(role="user")])
        (params,) = build_params(ctx, req, max_tokens=resolve_chat_max_tokens(ctx, None), logprobs=None, n=1)
        outputs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        req_id = ctx.engine.submit(ids, params, outputs.put)
        # Only the answer is shown: `<think>` reasoning, or gpt-oss's analysis channel, stays hidden.
        splitter: ReasoningSplitter | HarmonySplitter = (
            HarmonySplitter()
            if ctx.tool_parser.keeps_special_tokens
            else ReasoningSplitter(starts_in_reasoning(prompt_text))
        )
        finished = False
        try:
            while not finished:
                out = outputs.get()
                finished = out.finished
                if out.error:
                    raise ChatError(out.error)
                _, content = splitter.push(out.text_delta)
                if finished:
                    content += splitter.flush()[1]
                    if out.stop_reason == LOOP_STOP_REASON:
                        content += LOOP_NOTE
                if content:
                    yield content
        finally:
            if not finished:
                ctx.engine.abort(req_id)

    def close(self) -> None:
        self.ctx.engine.shutdown(drain_timeout_s=0)


def make_backend(settings: Settings) -> Backend:
    if settings.url:
        return RemoteBackend(settings)
    from localchat.serving.assembly import build_context

    return LocalBackend(build_context(settings, progress=lambda m: print(m, file=sys.stderr, flush=True)))


def run_chat(settings: Settings) -> int:
    backend = make_backend(settings)
    session = ChatSession(system=settings.system)
    try:
        if settings.message is not None:
            session.turns.append({"role": "user", "content": settings.message})
            for piece in backend.stream(session.messages()):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            return 0
        _repl(backend, session, rich_output=not settings.plain and sys.stdout.isatty())
        return 0
    finally:
        backend.close()


def _repl(backend: Backend, session: ChatSession, *, rich_output: bool) -> None:
    console = None
    if rich_output:
        from rich.console import Console

        console = Console()

    def ask(prompt: str) -> str:
        return console.input(prompt, markup=False) if console else input(prompt)

    print(HINT, file=sys.stderr)
    while True:
        try:
            line = console.input("[bold cyan]>>> [/]") if console else input(">>> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if (command := parse_command(line)) is not None:
            if not run_command(*command, session, ask):
                return
            continue
        text = message_text(line)
        if not text.strip():
            continue
        session.turns.append({"role": "user", "content": text})
        reply = _show_reply(backend.stream(session.messages()), console)
        if reply is None:  # failed: the question goes unanswered, so it leaves the history too
            session.turns.pop()
        else:
            session.turns.append({"role": "assistant", "content": reply})


def _show_reply(pieces: Iterator[str], console: Any) -> str | None:
    """Stream a reply to the screen; returns its text (cut short by Ctrl-C), None when it failed."""
    reply = ""
    try:
        with _keys_not_echoed():
            if console is None:
                for piece in pieces:
                    reply += piece
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                return reply
            from rich.live import Live
            from rich.markdown import Markdown

            with Live(
                Markdown(""), console=console, refresh_per_second=12, vertical_overflow="visible"
            ) as live:
                for piece in pieces:
                    reply += piece
                    live.update(Markdown(reply))
    except KeyboardInterrupt:
        pieces.close()  # type: ignore[attr-defined]  # closing the generator aborts the request
        print("\n[stopped]", file=sys.stderr)
    except ChatError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return None
    return reply


@contextlib.contextmanager
def _keys_not_echoed() -> Iterator[None]:
    """While a reply streams, typed keys are not echoed. NOTE: the terminal echoes Ctrl-C as `^C`; after
    a full-width line that moves the cursor down a line, rich's live view redraws one line too low and
    the reply's first line shows twice (so do Enter presses)."""
    try:
        import termios
    except ImportError:  # Windows: its console does not echo Ctrl-C
        yield
        return
    try:
        fd = sys.stdin.fileno() if sys.stdin.isatty() else -1
    except (OSError, ValueError):  # stdin closed or replaced
        fd = -1
    if fd < 0:
        yield
        return
    saved = termios.tcgetattr(fd)
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)  # [3]: the local modes
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
