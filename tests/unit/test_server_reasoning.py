"""The <think> splitter: same result however the text is cut into deltas."""

from __future__ import annotations

import random

import pytest

from localchat.serving.reasoning import ReasoningSplitter, split_reasoning, starts_in_reasoning

CASES = [
    ("<think>plan</think>\n\nanswer", False, "plan", "answer"),
    ("no tags at all, a < b and c > d", False, "", "no tags at all, a < b and c > d"),
    ("continued thought</think>The reply", True, "continued thought", "The reply"),
    ("<think>unfinished thought <thi", False, "unfinished thought <thi", ""),
    ("x <thinking> is not a tag</think>", False, "", "x <thinking> is not a tag</think>"),
    ("<think></think>empty", False, "", "empty"),
    ("a<think>b</think>c<think>d</think>e", False, "bd", "ace"),
]


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), CASES)
def test_split_whole(text, inside, reasoning, content):
    assert split_reasoning(text, inside) == (reasoning, content)


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), CASES)
def test_any_cut_into_deltas_gives_the_same_split(text, inside, reasoning, content):
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 8))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        splitter = ReasoningSplitter(inside)
        outs = [splitter.push(p) for p in pieces] + [splitter.flush()]
        assert ("".join(r for r, _ in outs), "".join(c for _, c in outs)) == (reasoning, content), pieces
        # Nothing of a tag ever leaks into content.
        assert all(
            "<think>" not in c and "</think" not in c
            for _, c in outs
            if text.count("<think>") == text.count("</think>")
        )


def test_one_character_at_a_time_holds_back_only_tag_prefixes():
    splitter = ReasoningSplitter()
    emitted = [splitter.push(ch) for ch in "ab<thi"]
    assert [c for _, c in emitted] == ["a", "b", "", "", "", ""]
    assert splitter.push("s is fine") == ("", "<this is fine")


def test_prompt_that_opens_a_think_block():
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n")
