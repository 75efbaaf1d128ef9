"""Gemma 3 image token expansion (#29): the processor's text replacement and the placeholder runs."""

from __future__ import annotations

import pytest

from localchat.vision.gemma3_prompt import ImageTokens

TOKENS = ImageTokens(tokens_per_image=3, image_token_id=9)


def test_start_marker_expands_as_transformers_processor_does() -> None:
    text = "<start_of_turn>user\nlook <start_of_image> and <start_of_image><end_of_turn>"
    image = "\n\n<start_of_image>" + "<image_soft_token>" * 3 + "<end_of_image>\n\n"
    assert TOKENS.expand(text) == f"<start_of_turn>user\nlook {image} and {image}<end_of_turn>"


def test_placeholder_runs_per_picture() -> None:
    ids = [1, 8, 9, 9, 9, 7, 2, 8, 9, 9, 9, 7]
    assert TOKENS.placeholders(ids) == [(2, 3, 4), (8, 9, 10)]
    assert TOKENS.placeholders([1, 2]) == []
    with pytest.raises(ValueError, match="3 consecutive"):
        TOKENS.placeholders([9, 9, 1, 9])
