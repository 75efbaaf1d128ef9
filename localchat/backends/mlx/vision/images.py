"""The MLX runner's side of image input, as localchat/backends/torch/vision/images.py on torch: the
vision tower of a multimodal checkpoint, an encoder cache by content hash (a picture is encoded once,
however many prefill chunks or turns carry it), and per step the (rows, values) that the text model
scatters over its placeholder embeddings."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import mlx.core as mx
import numpy as np

from localchat.backends.mlx.vision.gemma3 import Gemma3Vision, load_gemma3_vision
from localchat.backends.mlx.vision.gemma4 import Gemma4Vision, load_gemma4_mmproj, load_gemma4_vision
from localchat.backends.mlx.vision.llama4 import Llama4Vision, load_llama4_mmproj, load_llama4_vision
from localchat.backends.mlx.vision.llava import LlavaVision, load_llava_mmproj, load_llava_vision
from localchat.backends.mlx.vision.llava_next import (
    LlavaNextVision,
    load_llava_next_mmproj,
    load_llava_next_vision,
)
from localchat.backends.mlx.vision.pixtral import PixtralVision, load_pixtral_mmproj, load_pixtral_vision
from localchat.backends.mlx.vision.qwen_vl import QwenVision, load_qwen_vision
from localchat.backends.mlx.vision.qwen_vl_mmproj import load_qwen_vl_mmproj
from localchat.backends.mlx.vision.smolvlm import load_smolvlm_mmproj, load_smolvlm_vision
from localchat.engine.interface import ImageSlice
from localchat.errors import BackendUnavailableError
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
        vision: Gemma3Vision | QwenVision | LlavaVision | PixtralVision | Gemma4Vision | Llama4Vision,
        dtype: mx.Dtype,
    ) -> None:
        self.vision = vision
        self.dtype = dtype
        self.cache: EncoderCache[mx.array] = EncoderCache()

    def step_embeds(self, slices: list[ImageSlice]) -> tuple[mx.array, mx.array] | None:
        """(flat token rows, embedding rows) for this step's image slices; None when it has none."""
        if not slices:
            return None
        rows: list[int] = []
        values: list[mx.array] = []
        for part in slices:
            embeds = self.cache.get_or_encode(part.image.content_hash, partial(self._encode, part))
            rows.extend(part.token_rows)
            values.append(embeds[mx.array(part.embed_rows, dtype=mx.int32)])
        return mx.array(rows, dtype=mx.int32), mx.concatenate(values)

    def _encode(self, part: ImageSlice) -> mx.array:
        if isinstance(self.vision, LlavaNextVision):  # the whole picture + its tiles, and its size
            anyres: AnyresPixels = part.image.pixels
            tiles = mx.array(np.ascontiguousarray(anyres.tiles, dtype=np.float32)).astype(self.dtype)
            embeds = self.vision.encode_anyres(tiles, anyres.image_size)
            mx.eval(embeds)
            return embeds
        pixels = mx.array(np.ascontiguousarray(part.image.pixels, dtype=np.float32))
        if isinstance(self.vision, QwenVision):  # patches + the merged grid -> the patch grid
            assert part.image.grid is not None, "a Qwen-VL picture carries its grid"
            t, h, w = part.image.grid
            embeds = self.vision.encode(
                pixels.astype(self.dtype), (t, h * self.vision.merge, w * self.vision.merge)
            )
        else:
            embeds = self.vision.encode(pixels[None].astype(self.dtype))[0]
        mx.eval(embeds)  # cached: computed once, not re-traced by every step that reads it
        return embeds


def load_image_embedder(path: Path, dtype: mx.Dtype) -> ImageEmbedder | None:
    config = vision_config(path)
    if config is None:
        return None
    if "mmproj" in config and config.get("model_type") in SMOLVLM_TYPES:  # llama.cpp's `idefics3` projector
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        return ImageEmbedder(load_smolvlm_mmproj(config, Path(config["mmproj"]), dtype), dtype)
    if "mmproj" in config and config.get("model_type") in LLAVA_TYPES:  # llama.cpp's `mlp` projector
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        return ImageEmbedder(load_llava_mmproj(config, Path(config["mmproj"]), dtype), dtype)
    if "mmproj" in config and config.get("model_type") in LLAVA_NEXT_TYPES:  # LLaVA-NeXT's `mlp` projector
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        return ImageEmbedder(load_llava_next_mmproj(config, Path(config["mmproj"]), dtype), dtype)
    if "mmproj" in config and config.get("model_type") in QWEN_VL_TYPES:  # llama.cpp's Qwen-VL mergers
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        return ImageEmbedder(load_qwen_vl_mmproj(config, Path(config["mmproj"]), dtype), dtype)
    if "mmproj" in config and config.get("model_type") in PIXTRAL_TYPES:  # llama.cpp's `pixtral` projector
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        return ImageEmbedder(load_pixtral_mmproj(config, Path(config["mmproj"]), dtype), dtype)
    if "mmproj" in config and config.get("model_type") in GEMMA4_TYPES:  # llama.cpp's `gemma4v` projector
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        return ImageEmbedder(load_gemma4_mmproj(config, Path(config["mmproj"]), dtype), dtype)
    if "mmproj" in config and config.get("model_type") in LLAMA4_TYPES:  # llama.cpp's `llama4` projector
        log.info("loading the vision tower of %s from %s", path, config["mmproj"])
        return ImageEmbedder(load_llama4_mmproj(config, Path(config["mmproj"]), dtype), dtype)
    if "mmproj" in config:
        # The server takes pictures for the pair, so loading the text model alone would leave them nowhere.
        raise BackendUnavailableError(
            f"{path.name} has a vision projector paired ({Path(config['mmproj']).name}); the MLX backend "
            "runs Gemma 3's vision tower from a safetensors folder only (and LLaVA's and Qwen-VL's mmproj). Use --backend torch for this GGUF "
            "with its mmproj, or move the mmproj file out of the model's folder to chat without images."
        )
    log.info("loading the vision tower of %s", path)
    if config.get("model_type") in QWEN_VL_TYPES:
        tower = load_qwen_vision(path, dtype)
        if tower is None:  # a text-only export of a multimodal config: it still runs text
            log.warning("%s names a vision tower but holds none of its weights: images unsupported", path)
            return None
        return ImageEmbedder(tower, dtype)
    if config.get("model_type") in LLAVA_TYPES:
        return ImageEmbedder(load_llava_vision(path, dtype), dtype)
    if config.get("model_type") in LLAVA_NEXT_TYPES:  # a picture's base image + tiles: AnyresPixels
        return ImageEmbedder(load_llava_next_vision(path, dtype), dtype)
    if config.get("model_type") in GEMMA4_TYPES:  # a picture at its own size: [1, 3, H, W]
        gemma4 = load_gemma4_vision(path, dtype)
        if gemma4 is None:  # a text-only export of the multimodal config
            log.warning("%s names a vision tower but holds none of its weights: images unsupported", path)
            return None
        return ImageEmbedder(gemma4, dtype)
    if config.get("model_type") in PIXTRAL_TYPES:  # a picture at its own size: [1, 3, H, W]
        return ImageEmbedder(load_pixtral_vision(path, dtype), dtype)
    if config.get("model_type") in LLAMA4_TYPES:  # a picture's tiles: [1, tiles, 3, S, S]
        llama4 = load_llama4_vision(path, dtype)
        if llama4 is None:  # a text-only export of the multimodal config
            log.warning("%s names a vision tower but holds none of its weights: images unsupported", path)
            return None
        return ImageEmbedder(llama4, dtype)
    if config.get("model_type") in SMOLVLM_TYPES:  # a picture's tiles: [1, tiles, 3, S, S]
        return ImageEmbedder(load_smolvlm_vision(path, dtype), dtype)
    return ImageEmbedder(load_gemma3_vision(path, dtype), dtype)
