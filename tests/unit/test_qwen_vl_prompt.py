"""The Qwen-VL prompt side without a model (#29): <|image_pad|> expansion per picture grid, pairing pad runs
with pictures (and refusing a prompt whose runs do not fit), and M-RoPE positions worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from localchat.engine.request import ImageInput
from localchat.vision.mrope import mrope_positions, uses_mrope
from localchat.vision.qwen_vl_preprocess import QwenImageSpec
from localchat.vision.qwen_vl_prompt import QwenImagePrompt

PAD = 9
PROMPT_SIDE = QwenImagePrompt(QwenImageSpec(), PAD)


def test_each_pad_takes_its_pictures_token_count() -> None:
    text = "a <|vision_start|><|image_pad|><|vision_end|> b <|vision_start|><|image_pad|><|vision_end|>"
    out = PROMPT_SIDE.expand(text, [(1, 2, 3), (1, 1, 2)])
    assert out.count("<|image_pad|>") == 8
    assert "<|image_pad|>" * 6 + "<|vision_end|> b" in out
    with pytest.raises(ValueError, match="2 image slots for 1 images"):
        PROMPT_SIDE.expand(text, [(1, 2, 3)])


def test_pad_runs_pair_with_pictures_in_order() -> None:
    tokens = [1, 8, PAD, PAD, PAD, 7, 8, PAD, PAD, 7]
    pixels = np.zeros((1, 1), dtype=np.float32)
    a, b = PROMPT_SIDE.inputs(tokens, [("ha", pixels, (1, 1, 3)), ("hb", pixels, (1, 2, 1))])
    assert (a.placeholders, a.grid, b.placeholders, b.grid) == ((2, 3, 4), (1, 1, 3), (7, 8), (1, 2, 1))
    with pytest.raises(ValueError, match="consecutive"):
        PROMPT_SIDE.inputs(tokens, [("ha", pixels, (1, 2, 2)), ("hb", pixels, (1, 1, 1))])
    with pytest.raises(ValueError, match="no picture fills"):
        PROMPT_SIDE.inputs(tokens, [("ha", pixels, (1, 1, 3))])


def test_mrope_positions_by_hand() -> None:
    # text 0-1, a 2 x 3 image at 2-7, text 8-9: the image starts at 2, the text after it at 2 + max(2, 3)
    image = ImageInput(tuple(range(2, 8)), "h", None, (1, 2, 3))
    assert uses_mrope([image]) and not uses_mrope([ImageInput((0,), "g")])
    expected = np.array(
        [
            [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],  # temporal
            [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],  # rows
            [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],  # columns
        ]
    )
    assert np.array_equal(mrope_positions([image], 0, 10), expected)
    assert np.array_equal(mrope_positions([image], 4, 9), expected[:, 4:9])  # a chunk inside the run
    assert np.array_equal(mrope_positions([image], 12, 14), [[9, 10]] * 3)  # decode: index - 3
