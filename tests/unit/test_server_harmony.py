"""gpt-oss's harmony output -> (reasoning, content): analysis channel vs final, the same split however
the text is cut into deltas, markers and headers never leaking."""

from __future__ import annotations

import random

import pytest

from localchat.serving.harmony import HarmonySplitter, HarmonyThinkText, split_harmony

FULL = (
    "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
)
CASES = [
    (FULL, "User asks 2+2. Easy.", "2 + 2 = 4."),
    ("<|channel|>final<|message|>only an answer<|return|>", "", "only an answer"),
    ("<|channel|>analysis<|message|>cut off while thinking <|e", "cut off while thinking <|e", ""),
    ("plain text, a <| b and <x>", "", "plain text, a <| b and <x>"),
    (
        "<|channel|>analysis<|message|>need weather<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
        "need weather",
        '{"city":"Paris"}',
    ),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_split_whole(text: str, reasoning: str, content: str) -> None:
    assert split_harmony(text) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_any_cut_into_deltas_gives_the_same_split(text: str, reasoning: str, content: str) -> None:
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        splitter = HarmonySplitter()
        outs = [splitter.push(p) for p in pieces] + [splitter.flush()]
        assert ("".join(r for r, _ in outs), "".join(c for _, c in outs)) == (reasoning, content), pieces


def test_one_character_at_a_time_streams_the_body_and_holds_only_marker_prefixes() -> None:
    splitter = HarmonySplitter()
    outs = [splitter.push(ch) for ch in FULL]
    assert [r for r, _ in outs if r][:3] == ["U", "s", "e"]  # reasoning streams as it comes
    assert "".join(c for _, c in outs) == "2 + 2 = 4."
    assert all("<|" not in r + c for r, c in outs)


def test_think_text_form_for_stored_answers_the_same_for_any_cut() -> None:
    expected = "<think>User asks 2+2. Easy.</think>2 + 2 = 4."
    assert "".join(_think_pieces([FULL])) == expected
    assert "".join(_think_pieces(list(FULL))) == expected
    assert "".join(_think_pieces(["<|channel|>analysis<|message|>still thinking"])) == (
        "<think>still thinking</think>"
    )


def _think_pieces(pieces: list[str]) -> list[str]:
    think = HarmonyThinkText()
    return [think.push(p) for p in pieces] + [think.flush()]
