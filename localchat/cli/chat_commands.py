"""The terminal chat's conversation and its slash commands (`/help`, `/reset`, `/system`, `/exit`).
A command is never sent to the model; `//text` sends `/text` as a message."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Messages = list[dict[str, Any]]

HELP = """Commands (never sent to the model):
  /help          this list
  /reset         forget the conversation (asks first; the system prompt stays)
  /system TEXT   set the system prompt; /system alone shows it
  /exit          quit (also /quit or Ctrl-D)
Ctrl-C stops a reply. Start a message with // to send a line that begins with /."""
HINT = "Type /help for commands, /exit to quit (or Ctrl-D). Ctrl-C stops a reply."

# `/word` alone or followed by text; `/usr/bin/x …` (a path) is a message, not a command.
_COMMAND = re.compile(r"/([A-Za-z]+)(?:\s+(.*))?\Z", re.S)


@dataclass
class ChatSession:
    system: str | None = None
    turns: Messages = field(default_factory=list)  # user and assistant messages, in order

    def messages(self) -> Messages:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *self.turns]


def parse_command(line: str) -> tuple[str, str] | None:
    """(name, argument) when `line` is a slash command, else None."""
    match = _COMMAND.match(line.strip())
    return (match.group(1).lower(), (match.group(2) or "").strip()) if match else None


def message_text(line: str) -> str:
    """What a non-command line sends: `//x` is the escape for a message starting with `/x`."""
    return line.strip()[1:] if line.strip().startswith("//") else line


def run_command(name: str, arg: str, session: ChatSession, ask: Callable[[str], str]) -> bool:
    """Carry out one command; False when the chat should end. `ask` reads a line (for confirmations)."""
    if name in ("exit", "quit"):
        return False
    if name == "help":
        _say(HELP)
    elif name == "reset":
        _reset(session, ask)
    elif name == "system":
        if arg:
            session.system = arg
            _say("System prompt set; it applies from the next message.")
        else:
            _say(
                f"System prompt: {session.system}"
                if session.system
                else "No system prompt (/system TEXT sets one)."
            )
    else:
        _say(f"Unknown command /{name}. /help lists the commands; start with // to send it as a message.")
    return True


def _reset(session: ChatSession, ask: Callable[[str], str]) -> None:
    if not session.turns:
        _say("Nothing to forget: the conversation is empty.")
        return
    try:
        answer = ask(f"Forget the {len(session.turns)} messages of this conversation? [y/N] ")
    except (EOFError, KeyboardInterrupt):
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        session.turns.clear()
        _say("Conversation cleared" + (" (the system prompt stays)." if session.system else "."))
    else:
        _say("Kept the conversation.")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
