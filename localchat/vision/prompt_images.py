"""The server's side of a Gemma 3 image prompt, without torch: OpenAI `image_url` parts become the
template's {"type": "image"} parts, and after the rendered text is expanded and tokenized each decoded
picture is paired with its run of image tokens as an engine ImageInput."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.engine.request import ImageInput
from localchat.vision.content import ImageInputError
from localchat.vision.gemma3_preprocess import ImageSpec, decode, preprocess
from localchat.vision.gemma3_prompt import ImageTokens
from localchat.vision.model_info import vision_config


def template_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with each `image_url` content part as {"type": "image"}, the part Gemma 3's chat template
    renders as `<start_of_image>`; other messages and parts unchanged."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = [{"type": "image"} if p.get("type") == "image_url" else p for p in content]
            message = {**message, "content": parts}
        out.append(message)
    return out


@dataclass(frozen=True, slots=True)
class ImagePrompt:
    tokens: ImageTokens
    spec: ImageSpec

    @classmethod
    def from_folder(cls, path: Path) -> ImagePrompt | None:
        """None for a model that takes no images."""
        config = vision_config(path)
        if config is None:
            return None
        tokens = ImageTokens(
            int(config.get("mm_tokens_per_image", 256)),
            int(config.get("image_token_index", config.get("image_token_id", 262_144))),
        )
        return cls(tokens, ImageSpec.from_folder(path, int(config["vision_config"].get("image_size", 896))))

    def images(self, pictures: list[tuple[bytes, str]], token_ids: list[int]) -> tuple[ImageInput, ...]:
        """(file bytes, content hash) per picture in prompt order + the expanded prompt's token ids."""
        try:
            runs = self.tokens.placeholders(token_ids)
        except ValueError as exc:
            raise ImageInputError(str(exc)) from exc
        if len(runs) != len(pictures):
            raise ImageInputError(f"the prompt has {len(runs)} image slots for {len(pictures)} images")
        return tuple(
            ImageInput(run, digest, preprocess(decode(data), self.spec))
            for run, (data, digest) in zip(runs, pictures, strict=True)
        )
