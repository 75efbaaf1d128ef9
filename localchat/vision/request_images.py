"""The pictures of one chat request, for the API and the web UI alike: `prepare_images` reads every image
part of the messages (data:/file:/http(s) URLs under the server's limits, or bytes the UI already holds),
refuses what the model or the settings do not allow, decodes and preprocesses each picture, and gives the
messages the chat template reads. After the prompt is rendered, `expand` writes the image token runs into
the text, and `inputs` pairs each picture with its run in the token ids as an engine ImageInput.

Image parts accepted in a message's content list:
  {"type": "image_url", "image_url": {"url": URL}}  (or "image_url": URL)
  {"type": "image_bytes", "data": bytes}             (in-process callers: the web UI's stored files)
Blocking (file reads, fetches, decoding): call it on a worker thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localchat.engine.request import ImageInput
from localchat.vision.content import ImageInputError, ImageLimits, check_size, read_image_url
from localchat.vision.gemma3_preprocess import content_hash, decode, preprocess
from localchat.vision.gemma4_prompt import GEMMA4_TYPES, Gemma4ImagePrompt
from localchat.vision.llama4_prompt import LLAMA4_TYPES, Llama4ImagePrompt
from localchat.vision.llava_next_prompt import LLAVA_NEXT_TYPES, AnyresPixels, LlavaNextImagePrompt
from localchat.vision.llava_prompt import LLAVA_TYPES, LlavaImagePrompt
from localchat.vision.model_info import vision_config
from localchat.vision.pixtral_prompt import PIXTRAL_TYPES, PixtralImagePrompt
from localchat.vision.prompt_images import ImagePrompt
from localchat.vision.qwen_vl_prompt import QWEN_VL_TYPES, QwenImagePrompt
from localchat.vision.smolvlm_prompt import SMOLVLM_TYPES, SmolVLMImagePrompt

IMAGE_PART_TYPES = frozenset({"image_url", "image_bytes"})
VISION_HINT = (
    "load a vision model such as a Gemma 3 or Qwen2.5-VL safetensors folder "
    "(e.g. google/gemma-3-4b-it, Qwen/Qwen2.5-VL-3B-Instruct)"
)


class ImageRequestError(ImageInputError):
    """A 400 naming the request field at fault (`param`, e.g. messages[1].content[0])."""

    def __init__(self, message: str, param: str, code: str = "invalid_image") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class Picture:
    content_hash: str
    pixels: np.ndarray  # [3, size, size] float32, the model's preprocessing applied
    grid: tuple[int, int, int] | None = None  # Qwen-VL: the merged token grid (QwenImagePrompt)
    tiles: tuple[int, int] = (0, 0)  # SmolVLM / Idefics3: tile rows and columns (pixels: [tiles, 3, S, S])
    image_size: tuple[int, int] = (0, 0)  # LLaVA-NeXT: the picture's (height, width)


@dataclass(frozen=True, slots=True)
class PreparedImages:
    messages: list[dict[str, Any]]  # for the chat template: image parts as {"type": "image"}
    pictures: list[Picture] = field(default_factory=list)
    prompt: (
        ImagePrompt
        | QwenImagePrompt
        | LlavaImagePrompt
        | LlavaNextImagePrompt
        | PixtralImagePrompt
        | Gemma4ImagePrompt
        | SmolVLMImagePrompt
        | Llama4ImagePrompt
        | None
    ) = None  # None: the request has no picture

    def expand(self, prompt_text: str) -> str:
        """The rendered prompt with each picture's full run of image tokens, as the model's processor writes it."""
        # SmolVLM, Llama 4: each picture's tiles and its global image
        if isinstance(self.prompt, SmolVLMImagePrompt | Llama4ImagePrompt):
            try:
                return self.prompt.expand(prompt_text, [p.tiles for p in self.pictures])
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
        if isinstance(self.prompt, QwenImagePrompt):  # a pad run per picture, sized by its grid
            try:
                return self.prompt.expand(prompt_text, [p.grid or (1, 1, 1) for p in self.pictures])
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
        if isinstance(self.prompt, LlavaImagePrompt):
            return self.prompt.expand(prompt_text)
        if isinstance(self.prompt, LlavaNextImagePrompt):  # a run per picture, sized by its tile grid
            try:
                return self.prompt.expand(prompt_text, self._anyres_counts(self.prompt))
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
        # Pixtral: rows of [IMG] per picture; Gemma 4: one run per picture; each sized by its pixels
        if isinstance(self.prompt, PixtralImagePrompt | Gemma4ImagePrompt):
            try:
                return self.prompt.expand(prompt_text, [self.prompt.grid(p.pixels) for p in self.pictures])
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
        return self.prompt.tokens.expand(prompt_text) if self.prompt is not None else prompt_text

    def inputs(self, token_ids: list[int]) -> tuple[ImageInput, ...]:
        """Each picture with the positions of its image tokens in the expanded prompt's token ids."""
        if self.prompt is None:
            return ()
        if isinstance(self.prompt, SmolVLMImagePrompt | Llama4ImagePrompt):
            try:
                return self.prompt.inputs(
                    token_ids, [(p.content_hash, p.pixels, p.tiles) for p in self.pictures]
                )
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
        if isinstance(self.prompt, QwenImagePrompt):
            try:
                return self.prompt.inputs(
                    token_ids, [(p.content_hash, p.pixels, p.grid or (1, 1, 1)) for p in self.pictures]
                )
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
        if isinstance(self.prompt, LlavaNextImagePrompt):
            try:
                runs = self.prompt.placeholders(token_ids, self._anyres_counts(self.prompt))
            except ValueError as exc:
                raise ImageInputError(str(exc)) from exc
            return tuple(
                ImageInput(run, p.content_hash, AnyresPixels(p.pixels, p.image_size))
                for run, p in zip(runs, self.pictures, strict=True)
            )
        try:
            if isinstance(self.prompt, LlavaImagePrompt):
                runs = self.prompt.placeholders(token_ids)
            elif isinstance(self.prompt, PixtralImagePrompt | Gemma4ImagePrompt):
                runs = self.prompt.placeholders(
                    token_ids, [self.prompt.grid(p.pixels) for p in self.pictures]
                )
            else:
                runs = self.prompt.tokens.placeholders(token_ids)
        except ValueError as exc:
            raise ImageInputError(str(exc)) from exc
        if len(runs) != len(self.pictures):
            raise ImageInputError(
                f"the rendered prompt has {len(runs)} image slots for {len(self.pictures)} images "
                "(does the model's chat template place images?)"
            )
        return tuple(
            ImageInput(run, p.content_hash, p.pixels) for run, p in zip(runs, self.pictures, strict=True)
        )

    def _anyres_counts(self, prompt: LlavaNextImagePrompt) -> list[int]:
        return [prompt.tokens_per_image(p.image_size) for p in self.pictures]


def has_images(messages: list[dict[str, Any]]) -> bool:
    return any(_is_image(part) for _, _, part in _parts(messages))


def prepare_images(
    messages: list[dict[str, Any]], model_path: Path | None, model_id: str, limits: ImageLimits
) -> PreparedImages:
    """`messages`: template messages whose content may be a list of text and image parts.
    `model_path`: the loaded model's folder (None or a GGUF file: a model without vision).
    ImageRequestError (a 400) for a picture the model or the limits refuse, or one that is not an image."""
    found = [(i, j, part) for i, j, part in _parts(messages) if _is_image(part)]
    if not found:
        return PreparedImages(messages)
    first = f"messages[{found[0][0]}].content[{found[0][1]}]"
    prompt = _image_prompt(model_path) if model_path is not None else None
    if prompt is None:
        raise ImageRequestError(
            f"model {model_id} does not take images; {VISION_HINT}", first, "model_not_multimodal"
        )
    if len(found) > limits.max_images:
        raise ImageRequestError(
            f"at most {limits.max_images} images per request on this server (got {len(found)}); "
            "raise it with --max-images-per-request",
            first,
            "too_many_images",
        )
    pictures = []
    for i, j, part in found:
        where = f"messages[{i}].content[{j}]"
        try:
            data = _part_bytes(part, limits)
            image = decode(data)
        except ImageInputError as exc:
            raise ImageRequestError(f"{where}: {exc}", where) from exc
        except ValueError as exc:  # decode: not PNG/JPEG/WebP/GIF
            raise ImageRequestError(
                f"{where}: not a readable image (PNG, JPEG, WebP or GIF): {exc}", where
            ) from exc
        if isinstance(prompt, QwenImagePrompt):
            try:
                pixels, grid = prompt.preprocess(image)
            except ValueError as exc:  # an aspect ratio past 200
                raise ImageRequestError(f"{where}: {exc}", where) from exc
            pictures.append(Picture(content_hash(data), pixels, grid))
        elif isinstance(prompt, SmolVLMImagePrompt | Llama4ImagePrompt):
            pixels, tiles = prompt.preprocess(image)
            pictures.append(Picture(content_hash(data), pixels, tiles=tiles))
        elif isinstance(prompt, LlavaNextImagePrompt):
            anyres = prompt.preprocess(image)
            pictures.append(Picture(content_hash(data), anyres.tiles, image_size=anyres.image_size))
        elif isinstance(prompt, LlavaImagePrompt | PixtralImagePrompt | Gemma4ImagePrompt):
            pictures.append(Picture(content_hash(data), prompt.preprocess(image)))
        else:
            pictures.append(Picture(content_hash(data), preprocess(image, prompt.spec)))
    return PreparedImages(_template_messages(messages), pictures, prompt)


def _image_prompt(
    path: Path,
) -> (
    ImagePrompt
    | QwenImagePrompt
    | LlavaImagePrompt
    | LlavaNextImagePrompt
    | PixtralImagePrompt
    | Gemma4ImagePrompt
    | SmolVLMImagePrompt
    | Llama4ImagePrompt
    | None
):
    config = vision_config(path)
    if config is not None and config.get("model_type") in LLAMA4_TYPES:
        return Llama4ImagePrompt.from_config(path, config)
    if config is not None and config.get("model_type") in SMOLVLM_TYPES:
        return SmolVLMImagePrompt.from_config(path, config)
    if config is not None and config.get("model_type") in QWEN_VL_TYPES:
        return QwenImagePrompt.from_config(path, config)
    if config is not None and config.get("model_type") in LLAVA_TYPES:
        return LlavaImagePrompt.from_config(path, config)
    if config is not None and config.get("model_type") in LLAVA_NEXT_TYPES:
        return LlavaNextImagePrompt.from_config(path, config)
    if config is not None and config.get("model_type") in PIXTRAL_TYPES:
        return PixtralImagePrompt.from_config(path, config)
    if config is not None and config.get("model_type") in GEMMA4_TYPES:
        return Gemma4ImagePrompt.from_config(path, config)
    return ImagePrompt.from_folder(path)


def _parts(messages: list[dict[str, Any]]) -> list[tuple[int, int, dict[str, Any]]]:
    return [
        (i, j, part)
        for i, message in enumerate(messages)
        if isinstance(message.get("content"), list)
        for j, part in enumerate(message["content"])
        if isinstance(part, dict)
    ]


def _is_image(part: dict[str, Any]) -> bool:
    return part.get("type") in IMAGE_PART_TYPES


def _part_bytes(part: dict[str, Any], limits: ImageLimits) -> bytes:
    if part.get("type") == "image_bytes":
        data = part.get("data")
        if not isinstance(data, bytes):
            raise ImageInputError("an image_bytes part needs its data as bytes")
        check_size(len(data), limits)
        return data
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url:
        raise ImageInputError('an image_url part needs {"image_url": {"url": "data:image/png;base64,..."}}')
    return read_image_url(url, limits)


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = [{"type": "image"} if isinstance(p, dict) and _is_image(p) else p for p in content]
            message = {**message, "content": parts}
        out.append(message)
    return out
