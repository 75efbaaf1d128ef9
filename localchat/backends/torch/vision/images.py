"""The runner's side of image input: the vision tower of a multimodal checkpoint, an encoder cache by
content hash (a picture is encoded once, however many prefill chunks or turns carry it), and per step the
(rows, values) that the text model scatters over its placeholder embeddings."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import numpy as np
import torch

from localchat.backends.torch.vision.gemma3 import Gemma3Vision, load_gemma3_vision
from localchat.backends.torch.vision.gemma3_mmproj import load_gemma3_mmproj
from localchat.backends.torch.vision.gemma4 import Gemma4Vision, has_gemma4_vision, load_gemma4_vision
from localchat.backends.torch.vision.gemma4_mmproj import load_gemma4_mmproj
from localchat.backends.torch.vision.llama4 import Llama4Vision, load_llama4_vision
from localchat.backends.torch.vision.llama4_mmproj import load_llama4_mmproj
from localchat.backends.torch.vision.llava import LlavaVision, load_llava_vision
from localchat.backends.torch.vision.llava_mmproj import load_llava_mmproj
from localchat.backends.torch.vision.llava_next import (
    LlavaNextVision,
    load_llava_next_mmproj,
    load_llava_next_vision,
)
from localchat.backends.torch.vision.pixtral import PixtralVision, load_pixtral_mmproj, load_pixtral_vision
from localchat.backends.torch.vision.qwen_vl import QwenVisionTower, encode_image, load_qwen_vision
from localchat.backends.torch.vision.qwen_vl_mmproj import load_qwen_vl_mmproj
from localchat.backends.torch.vision.smolvlm import SmolVLMVision, load_smolvlm_mmproj, load_smolvlm_vision
from localchat.engine.interface import ImageSlice
from localchat.vision.encoder_cache import EncoderCache
from localchat.vision.gemma4_prompt import GEMMA4_TYPES
from localchat.vision.llama4_prompt import LLAMA4_TYPES
from localchat.vision.llava_next_prompt import LLAVA_NEXT_TYPES, AnyresPixels
from localchat.vision.llava_prompt import LLAVA_TYPES
from localchat.vision.model_info import vision_config
from localchat.vision.pixtral_prompt import PIXTRAL_TYPES
from localchat.vision.qwen_vl_prompt import QWEN_VL_TYPES
from localchat.vision.smolvlm_prompt import SMOLVLM_TYPES

log = logging.getLogger(__name__)


class ImageEmbedder:
    def __init__(
        self,
        vision: Gemma3Vision
        | QwenVisionTower
        | LlavaVision
        | SmolVLMVision
        | PixtralVision
        | Gemma4Vision
        | Llama4Vision,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.vision = vision.to(device)
        self.device = device
        self.dtype = dtype
        self.cache: EncoderCache[torch.Tensor] = EncoderCache()

    def step_embeds(self, slices: list[ImageSlice]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(flat token rows, embedding rows) for this step's image slices; None when it has none."""
        if not slices:
            return None
        rows: list[int] = []
        values: list[torch.Tensor] = []
        for part in slices:
            embeds = self.cache.get_or_encode(part.image.content_hash, partial(self._encode, part))
            rows.extend(part.token_rows)
            values.append(embeds[part.embed_rows])
        return torch.tensor(rows, device=self.device), torch.cat(values)

    def _encode(self, part: ImageSlice) -> torch.Tensor:
        if isinstance(self.vision, QwenVisionTower):  # patches + the merged grid -> the patch grid
            assert part.image.grid is not None, "a Qwen-VL picture carries its grid"
            t, h, w = part.image.grid
            return encode_image(
                self.vision, part.image.pixels, (t, h * self.vision.merge, w * self.vision.merge)
            )
        if isinstance(self.vision, LlavaNextVision):  # the whole picture + its tiles, and its size
            anyres: AnyresPixels = part.image.pixels
            tiles = torch.from_numpy(np.ascontiguousarray(anyres.tiles, dtype=np.float32))
            return self.vision.encode_anyres(tiles.to(self.device, self.dtype), anyres.image_size)
        pixels = torch.from_numpy(np.ascontiguousarray(part.image.pixels, dtype=np.float32))[None]
        return self.vision.encode(pixels.to(self.device, self.dtype))[0]


def load_image_embedder(path: Path, device: torch.device, dtype: torch.dtype) -> ImageEmbedder | None:
    config = vision_config(path)
    if config is None:
        return None
    if "mmproj" in config:  # a GGUF with llama.cpp's projector file beside it
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        if config.get("model_type") in SMOLVLM_TYPES:
            return ImageEmbedder(load_smolvlm_mmproj(config, Path(config["mmproj"]), dtype), device, dtype)
        if config.get("model_type") in LLAVA_TYPES:
            return ImageEmbedder(load_llava_mmproj(config, Path(config["mmproj"]), dtype), device, dtype)
        if config.get("model_type") in LLAVA_NEXT_TYPES:
            vision = load_llava_next_mmproj(config, Path(config["mmproj"]), dtype)
            return ImageEmbedder(vision, device, dtype)
        if config.get("model_type") in QWEN_VL_TYPES:
            return ImageEmbedder(load_qwen_vl_mmproj(config, Path(config["mmproj"]), dtype), device, dtype)
        if config.get("model_type") in PIXTRAL_TYPES:
            return ImageEmbedder(load_pixtral_mmproj(config, Path(config["mmproj"]), dtype), device, dtype)
        if config.get("model_type") in GEMMA4_TYPES:
            return ImageEmbedder(load_gemma4_mmproj(config, Path(config["mmproj"]), dtype), device, dtype)
        if config.get("model_type") in LLAMA4_TYPES:
            return ImageEmbedder(load_llama4_mmproj(config, Path(config["mmproj"]), dtype), device, dtype)
        return ImageEmbedder(load_gemma3_mmproj(config, Path(config["mmproj"]), dtype), device, dtype)
    log.info("loading the vision tower of %s", path)
    if config.get("model_type") in QWEN_VL_TYPES:
        tower = load_qwen_vision(path, dtype)
        if tower is None:  # a text-only export of a multimodal config: it still runs text
            log.warning("%s names a vision tower but holds none of its weights: images unsupported", path)
            return None
        return ImageEmbedder(tower, device, dtype)
    if config.get("model_type") in LLAVA_TYPES:
        return ImageEmbedder(load_llava_vision(path, dtype), device, dtype)
    if config.get("model_type") in LLAVA_NEXT_TYPES:  # a picture's base image + tiles: AnyresPixels
        return ImageEmbedder(load_llava_next_vision(path, dtype), device, dtype)
    if config.get("model_type") in GEMMA4_TYPES:  # a picture at its own size: [1, 3, H, W]
        if not has_gemma4_vision(path):  # a text-only export of the multimodal config
            log.warning("%s names a vision tower but holds none of its weights: images unsupported", path)
            return None
        return ImageEmbedder(load_gemma4_vision(path, dtype), device, dtype)
    if config.get("model_type") in PIXTRAL_TYPES:  # a picture at its own size: [1, 3, H, W]
        return ImageEmbedder(load_pixtral_vision(path, dtype), device, dtype)
    if config.get("model_type") in LLAMA4_TYPES:  # a picture's tiles: [1, tiles, 3, S, S]
        llama4 = load_llama4_vision(path, dtype)
        if llama4 is None:  # a text-only export of the multimodal config
            log.warning("%s names a vision tower but holds none of its weights: images unsupported", path)
            return None
        return ImageEmbedder(llama4, device, dtype)
    if config.get("model_type") in SMOLVLM_TYPES:  # a picture's tiles: [1, tiles, 3, S, S]
        return ImageEmbedder(load_smolvlm_vision(path, dtype), device, dtype)
    return ImageEmbedder(load_gemma3_vision(path, dtype), device, dtype)
