"""A request's pictures (#29) without torch: data/file/http URLs under the server's limits, the 400s for
text-only models, too many or too large pictures, undecodable bytes and URLs the settings refuse; the
template parts and the pairing with image-token runs; the encoder cache keyed by content hash."""

from __future__ import annotations

import base64
import http.server
import io
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from localchat.vision.content import ImageInputError, ImageLimits, read_image_url
from localchat.vision.encoder_cache import EncoderCache
from localchat.vision.gemma3_preprocess import content_hash
from localchat.vision.request_images import ImageRequestError, has_images, prepare_images


def _image(seed: int, fmt: str = "PNG", size: tuple[int, int] = (8, 8)) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(buf, format=fmt)
    return buf.getvalue()


def _part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": list(parts)}]


@pytest.fixture
def vision_folder(tmp_path: Path) -> Path:
    config = {"model_type": "gemma3", "mm_tokens_per_image": 2, "image_token_index": 9}
    (tmp_path / "config.json").write_text(json.dumps(config | {"vision_config": {"image_size": 28}}))
    return tmp_path


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_becomes_a_picture_paired_with_its_token_run(vision_folder: Path, fmt: str) -> None:
    a, b = _image(0, fmt), _image(1, fmt, (30, 20))
    text = {"type": "text", "text": "what?"}
    prepared = prepare_images(
        _user(text, _part(_data_url(a, f"image/{fmt.lower()}")), {"type": "image_bytes", "data": b}),
        vision_folder,
        "m",
        ImageLimits(),
    )
    assert prepared.messages[1]["content"] == [text, {"type": "image"}, {"type": "image"}]
    assert (
        prepared.expand("x<start_of_image>")
        == "x\n\n<start_of_image><image_soft_token><image_soft_token><end_of_image>\n\n"
    )
    images = prepared.inputs([1, 8, 9, 9, 7, 3, 8, 9, 9, 7])
    assert [i.placeholders for i in images] == [(2, 3), (7, 8)]
    assert [i.content_hash for i in images] == [content_hash(a), content_hash(b)]
    assert images[0].pixels.shape == (3, 28, 28) and images[0].pixels.dtype == np.float32
    with pytest.raises(ImageInputError, match="1 image slots for 2 images"):
        prepared.inputs([1, 9, 9, 2])


def test_messages_without_pictures_pass_unchanged_and_touch_no_file() -> None:
    messages = _user({"type": "text", "text": "hi"})
    prepared = prepare_images(messages, Path("/nonexistent"), "m", ImageLimits())
    assert prepared.messages is messages and prepared.inputs([1, 2]) == () and not has_images(messages)
    assert prepared.expand("a<start_of_image>") == "a<start_of_image>"


@pytest.mark.parametrize(
    ("part", "limits", "message", "code"),
    [
        (_part("https://example.com/a.png"), ImageLimits(), "--allow-image-urls", "invalid_image"),
        (_part("file:///etc/hostname"), ImageLimits(), "--allow-local-image-files", "invalid_image"),
        (_part("data:image/png;base64,!!"), ImageLimits(), "bad base64", "invalid_image"),
        (_part("data:text/plain;base64,AAAA"), ImageLimits(), "data:image/png;base64", "invalid_image"),
        (_part("data:image/png;base64,AAAA"), ImageLimits(), "not a readable image", "invalid_image"),
        (_part("ftp://x/a.png"), ImageLimits(), "must be a data: URL", "invalid_image"),
        ({"type": "image_url"}, ImageLimits(), "needs", "invalid_image"),
        (
            _part(_data_url(_image(0, size=(300, 300)))),
            ImageLimits(max_bytes=1000),
            "--max-image-mib",
            "invalid_image",
        ),
    ],
)
def test_refusals_name_the_part_and_the_fix(
    vision_folder: Path, part: dict[str, Any], limits: ImageLimits, message: str, code: str
) -> None:
    with pytest.raises(ImageRequestError, match=message) as info:
        prepare_images(_user({"type": "text", "text": "hi"}, part), vision_folder, "m", limits)
    assert info.value.param == "messages[1].content[1]" and info.value.code == code


def test_text_only_model_and_too_many_pictures(vision_folder: Path, tmp_path: Path) -> None:
    part = _part(_data_url(_image(0)))
    with pytest.raises(
        ImageRequestError, match="model smol does not take images; load a vision model"
    ) as info:
        prepare_images(_user(part), tmp_path / "model.gguf", "smol", ImageLimits())
    assert info.value.code == "model_not_multimodal"
    with pytest.raises(
        ImageRequestError, match=r"at most 2 images per request.*got 3.*--max-images-per-request"
    ):
        prepare_images(_user(part, part, part), vision_folder, "m", ImageLimits(max_images=2))


def test_local_files_only_when_allowed(tmp_path: Path) -> None:
    path = tmp_path / "a picture.png"
    path.write_bytes(_image(3))
    url = path.as_uri()
    assert read_image_url(url, ImageLimits(allow_local_files=True)) == path.read_bytes()
    with pytest.raises(ImageInputError, match="could not read"):
        read_image_url((tmp_path / "gone.png").as_uri(), ImageLimits(allow_local_files=True))


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


def test_http_urls_are_fetched_only_when_allowed_and_capped() -> None:
    body = _image(4)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/a.png":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert read_image_url(f"{base}/a.png", ImageLimits(allow_urls=True)) == body
        with pytest.raises(ImageInputError, match="--allow-image-urls"):
            read_image_url(f"{base}/a.png", ImageLimits())
        with pytest.raises(ImageInputError, match="--max-image-mib"):
            read_image_url(f"{base}/a.png", ImageLimits(allow_urls=True, max_bytes=10))
        with pytest.raises(ImageInputError, match="could not fetch the image"):
            read_image_url(f"{base}/missing.png", ImageLimits(allow_urls=True))
    finally:
        server.shutdown()
