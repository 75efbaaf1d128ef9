"""SmolVLM's and Idefics3's image encoder: the SigLIP ViT that Gemma 3 uses (gemma3.SiglipTower) run on
each tile of a picture, then the connector: a pixel shuffle that folds each scale x scale block of patches
into one row (scale² times wider), and a matrix without bias into the text model's width. Tiles are always
full squares here (the preprocessing resizes to multiples of the tile), so the tower's position ids are
the plain patch order and no patch mask is needed. Module names follow the checkpoint's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from localchat.backends.torch.vision.gemma3 import SiglipTower
from localchat.errors import ModelLoadError
from localchat.vision.smolvlm_mmproj import read_smolvlm_mmproj
from localchat.vision.smolvlm_prompt import vision_settings

# The hub files and transformers 5's save_pretrained both write these names.
_PREFIXES = (("model.vision_model.", "vision_model."), ("model.connector.", "connector."))


class _Projection(nn.Module):
    def __init__(self, width: int, text_hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, text_hidden, bias=False)


class Connector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.modality_projection = _Projection(vision_hidden * scale * scale, text_hidden)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[tiles, grid², d] -> [tiles, (grid / scale)², d * scale²]: the processor's token order, row by row
        over blocks, each block's patches concatenated row-major."""
        n, count, d = patches.shape
        grid, s = round(count**0.5), self.scale
        blocks = patches.view(n, grid // s, s, grid // s, s, d).permute(0, 1, 3, 2, 4, 5)
        return self.modality_projection.proj(blocks.reshape(n, count // (s * s), d * s * s))


class SmolVLMVision(nn.Module):
    """pixel values [batch, tiles, 3, S, S] -> image embeddings [batch, tiles * tokens per tile, hidden]."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        vision, text = vision_settings(config), config["text_config"]
        act = vision["hidden_act"]
        if act != "gelu_pytorch_tanh":
            raise ModelLoadError(f"SmolVLM vision tower with hidden_act {act!r} is not supported")
        self.vision_model = SiglipTower(vision)
        self.connector = Connector(
            int(vision["hidden_size"]), int(text["hidden_size"]), int(config.get("scale_factor", 2))
        )

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        batch = pixels.shape[0]
        rows = self.connector(self.vision_model(pixels.flatten(0, 1)))
        return rows.reshape(batch, -1, rows.shape[-1])


def load_smolvlm_vision(folder: Path, dtype: torch.dtype = torch.float32) -> SmolVLMVision:
    """The tower and connector of a SmolVLMForConditionalGeneration / Idefics3ForConditionalGeneration
    safetensors folder."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                state[key] = handle.get_tensor(key)
    return _load(json.loads((folder / "config.json").read_text()), state, dtype, folder.name)


def load_smolvlm_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> SmolVLMVision:
    """The same from llama.cpp's `idefics3` mmproj; `config`: localchat.vision.mmproj's dict for the pair."""
    state = {name: torch.from_numpy(values) for name, values in read_smolvlm_mmproj(mmproj).items()}
    return _load(config, state, dtype, mmproj.name)


def _load(
    config: dict[str, Any], checkpoint: dict[str, torch.Tensor], dtype: torch.dtype, source: str
) -> SmolVLMVision:
    model = SmolVLMVision(config)
    state = {
        ours + key[len(prefix) :]: value
        for key, value in checkpoint.items()
        for prefix, ours in _PREFIXES
        if key.startswith(prefix)
    }
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{source} does not hold a SmolVLM vision tower: {exc}") from exc
    return model.to(dtype).eval()
