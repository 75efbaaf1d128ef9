"""Image content parts (data URLs, refused URLs, the per-request cap, text-only models) and the encoder
cache keyed by content hash."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from localchat.vision.content import ImageInputError, image_parts
from localchat.vision.encoder_cache import EncoderCache
from localchat.vision.gemma3_preprocess import content_hash


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def _part(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_data_urls_decode_with_their_hash() -> None:
    a, b = _png(0), _png(1)
    got = image_parts(
        [{"type": "text", "text": "hi"}, _part(_data_url(a)), _part(_data_url(b))],
        model="m",
        takes_images=True,
        max_images=4,
        allow_urls=False,
    )
    assert got == [(a, content_hash(a)), (b, content_hash(b))]


@pytest.mark.parametrize(
    ("parts", "takes", "allow", "message"),
    [
        ([_part("data:image/png;base64,AAAA")], False, False, "model m does not take images"),
        ([_part("https://example.com/a.png")], True, False, "--allow-image-urls"),
        ([_part("data:image/png;base64,!!")], True, False, "bad base64"),
        ([_part("data:text/plain;base64,AAAA")], True, False, "data:image/"),
        ([_part("data:image/png;base64,AAAA")] * 3, True, False, "at most 2 images"),
    ],
)
def test_refusals(parts: list[dict[str, object]], takes: bool, allow: bool, message: str) -> None:
    with pytest.raises(ImageInputError, match=message):
        image_parts(parts, model="m", takes_images=takes, max_images=2, allow_urls=allow)


def test_urls_pass_only_when_allowed() -> None:
    url = "https://example.com/a.png"
    assert image_parts([_part(url)], model="m", takes_images=True, max_images=1, allow_urls=True) == [
        (url, "")
    ]


def test_encoder_cache_hits_by_content_hash_and_evicts_lru() -> None:
    cache: EncoderCache[int] = EncoderCache(capacity=2)
    calls: list[str] = []

    def enc(key: str) -> int:
        calls.append(key)
        return len(calls)

    assert cache.get_or_encode("a", lambda: enc("a")) == 1
    assert cache.get_or_encode("a", lambda: enc("a")) == 1  # same picture: not encoded again
    cache.get_or_encode("b", lambda: enc("b"))
    cache.get_or_encode("c", lambda: enc("c"))  # evicts "a", the least recently used
    cache.get_or_encode("a", lambda: enc("a"))
    assert calls == ["a", "b", "c", "a"] and (cache.hits, cache.misses) == (1, 4) and len(cache) == 2
