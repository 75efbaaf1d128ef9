"""`localchat chat` with a model that speaks gpt-oss's harmony format (the fake backend with
`--tool-call-parser harmony`): the reply shows the final channel only, as a `<think>` model's reply shows
its answer only; the analysis channel and the markers never reach the terminal, nor the next prompt."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.live_server import REPO

CHAT = [
    *(sys.executable, "-m", "localchat", "chat", "--backend", "fake", "--mem", "1", "--log", "warning"),
    *("--tool-call-parser", "harmony"),
]
ANSWER = (
    "<|channel|>analysis<|message|>The user greets me.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello there!"
)


def test_terminal_chat_shows_the_final_channel_only() -> None:
    script = f"<<say:{ANSWER}>>\n/exit\n"
    run = subprocess.run(CHAT, input=script, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    replies = [line.removeprefix(">>> ") for line in run.stdout.splitlines() if line.strip(" >")]
    assert replies == ["Hello there!"], run.stdout
    assert "<|" not in run.stdout and "greets" not in run.stdout


def test_one_shot_message_and_a_reply_cut_while_thinking() -> None:
    run = subprocess.run(
        [*CHAT, "--message", f"<<say:{ANSWER}>>"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert (run.returncode, run.stdout) == (0, "Hello there!\n"), run.stderr
    thinking_only = "<<say:<|channel|>analysis<|message|>still thinking>>"
    run = subprocess.run(
        [*CHAT, "--message", thinking_only], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert (run.returncode, run.stdout) == (0, "\n"), run.stderr
