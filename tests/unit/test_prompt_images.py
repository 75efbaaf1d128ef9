"""A Gemma 3 image prompt on the server side (#29): image_url parts for the template, pictures paired
with their image-token runs as engine inputs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from localchat.vision.content import ImageInputError
from localchat.vision.gemma3_preprocess import content_hash
from localchat.vision.prompt_images import ImagePrompt, template_parts


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((20, 30, 3), value, dtype=np.uint8), "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_url_parts_become_template_image_parts() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {}}],
        },
    ]
    out = template_parts(messages)
    assert out[0] == messages[0]
    assert out[1]["content"] == [{"type": "text", "text": "what?"}, {"type": "image"}]


def test_pictures_pair_with_their_token_runs(tmp_path: Path) -> None:
    config = {"model_type": "gemma3", "mm_tokens_per_image": 2, "image_token_index": 9}
    (tmp_path / "config.json").write_text(json.dumps(config | {"vision_config": {"image_size": 28}}))
    prompt = ImagePrompt.from_folder(tmp_path)
    assert prompt is not None and prompt.tokens.tokens_per_image == 2
    pictures = [(data, content_hash(data)) for data in (_png(10), _png(200))]
    images = prompt.images(pictures, [1, 8, 9, 9, 7, 3, 8, 9, 9, 7])
    assert [i.placeholders for i in images] == [(2, 3), (7, 8)]
    assert [i.content_hash for i in images] == [h for _, h in pictures]
    assert images[0].pixels.shape == (3, 28, 28)
    with pytest.raises(ImageInputError, match="1 image slots for 2 images"):
        prompt.images(pictures, [1, 9, 9, 2])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert ImagePrompt.from_folder(tmp_path) is None
