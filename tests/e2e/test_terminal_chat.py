"""`localchat chat` on the fake backend as the user meets it: on a real pty (Ctrl-C mid-reply) and
with piped input (the slash commands, which never reach the model)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers.live_server import REPO

CHAT = [sys.executable, "-m", "localchat", "chat", "--backend", "fake", "--mem", "1", "--log", "warning"]


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")
def test_ctrl_c_during_a_reply_shows_each_line_once():
    from tests.helpers.pty_terminal import PtyTerminal

    term = PtyTerminal(CHAT, cwd=str(REPO))
    try:
        term.wait_for(lambda screen: ">>>" in screen)
        # Paragraphs stream one byte per 60 ms: Ctrl-C lands mid-reply, after a few full-width lines. The
        # tail is ~50 s long so a loaded CI box (which once let a 13 s tail finish first) still lands it.
        reply = r"alpha para\n\nbravo para\n\ncharlie para that goes on for a long while " + "and on " * 120
        term.send(f"<<slow:60>><<say:{reply}>>\r".encode())
        term.wait_for(lambda _: any(line.startswith("charlie para") for line in term.lines()))
        term.send(b"\x03")
        screen = term.wait_for(lambda screen: "[stopped]" in screen and screen.rstrip().endswith(">>>"))
        lines = term.lines()
        assert lines.count("alpha para") == 1, screen
        assert lines.count("bravo para") == 1, screen
        assert "^C" not in screen
        term.send(b"/help\r")  # the chat goes on after the stopped reply
        term.wait_for(lambda screen: "Commands (never sent to the model)" in screen)
        term.send(b"/exit\r")
        assert term.proc.wait(30) == 0
    finally:
        term.close()


def _chat(script: str, *args: str) -> tuple[list[str], str]:
    """(the model's replies, stderr) for piped input; prompts and confirmations are stripped."""
    run = subprocess.run([*CHAT, *args], input=script, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = re.sub(r"(>>> |Forget the \d+ messages of this conversation\? \[y/N\] )", "\n", run.stdout)
    return [line for line in out.splitlines() if line.strip()], run.stderr


def test_slash_commands_never_reach_the_model():
    # Without a <<say:>> the fake model answers its default markdown sample: any command that reached
    # the model would add a reply.
    replies, err = _chat(
        "/help\n/HELP\n/nonsense here\n/system\n<<say:only reply>>\n/exit\n<<say:after exit>>\n"
    )
    assert replies == ["only reply"]
    assert err.count("Commands (never sent to the model)") == 2 and "/reset" in err
    assert "Unknown command /nonsense" in err and "No system prompt" in err


def test_reset_asks_first_and_keeps_the_system_prompt():
    # The fake model obeys the first <<say:>> of its whole prompt, so a reply tells what history it got.
    script = "<<say:first>>\n<<say:second>>\n/reset\nn\n<<say:third>>\n/reset\ny\n<<say:fourth>>\n/exit\n"
    replies, err = _chat(script)
    assert replies == ["first", "first", "first", "fourth"]
    assert "Kept the conversation." in err and "Conversation cleared." in err
    replies, err = _chat("/system <<say:from the system>>\n<<say:user>>\n/reset\ny\nhello\n/system\n")
    assert replies == ["from the system", "from the system"]
    assert "the system prompt stays" in err and "System prompt: <<say:from the system>>" in err


def test_double_slash_and_paths_are_messages():
    assert _chat("//x <<say:sent>>\n")[0] == ["sent"]
    assert _chat("/usr/bin/env <<say:a path>>\n")[0] == ["a path"]
