"""LLaVA-NeXT's image encoder: LLaVA 1.5's CLIP tower and MLP projector (backends/torch/vision/llava.py)
run on the whole picture and on each anyres tile; the tiles' feature grids are stitched into one, cropped
to the picture (the padding's rows or columns dropped), and each feature row ends with the learned
`image_newline` vector. The whole picture's rows come first (localchat/vision/llava_next_prompt.py has the
token arithmetic)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from localchat.backends.torch.vision.llava import _PREFIXES, LlavaVision
from localchat.errors import ModelLoadError
from localchat.vision.llava_mmproj import read_llava_mmproj
from localchat.vision.llava_next_prompt import DEFAULT_PINPOINTS, best_resolution, unpadded_bounds

_NEWLINE_KEYS = ("model.image_newline", "image_newline")


class LlavaNextVision(LlavaVision):
    def __init__(self, config: dict[str, Any]) -> None:
        if config.get("vision_feature_select_strategy", "default") != "default":
            # the tiles' CLS rows would break their patch grids (transformers cannot run it either)
            raise ModelLoadError("LLaVA-NeXT runs only vision_feature_select_strategy 'default'")
        super().__init__(config)
        self.image_newline = nn.Parameter(torch.zeros(int(config["text_config"]["hidden_size"])))
        self.pinpoints = tuple(
            (int(h), int(w)) for h, w in config.get("image_grid_pinpoints", DEFAULT_PINPOINTS)
        )
        self.tile = int(config["vision_config"]["image_size"])
        self.grid = self.tile // int(config["vision_config"]["patch_size"])

    @torch.inference_mode()
    def encode_anyres(self, tiles: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """[1 + tiles, 3, S, S] (the whole picture first) -> the picture's embedding rows [tokens, hidden]."""
        features = self.encode(tiles)  # [1 + tiles, grid * grid (+ CLS under "full"), hidden]
        target = best_resolution(image_size, self.pinpoints)
        tile_rows, tile_columns = target[0] // self.tile, target[1] // self.tile
        g, hidden = self.grid, features.shape[-1]
        # tiles row by row, each a g x g patch grid -> one (tile_rows * g) x (tile_columns * g) grid
        grid = features[1:].reshape(tile_rows, tile_columns, g, g, hidden).permute(0, 2, 1, 3, 4)
        grid = grid.reshape(tile_rows * g, tile_columns * g, hidden)
        top, bottom, left, right = unpadded_bounds(image_size, (tile_rows * g, tile_columns * g))
        grid = grid[top:bottom, left:right]
        newline = self.image_newline.to(grid.dtype).expand(grid.shape[0], 1, hidden)
        rows = torch.cat([grid, newline], dim=1).reshape(-1, hidden)
        return torch.cat([features[0], rows])


def load_llava_next_vision(folder: Path, dtype: torch.dtype = torch.float32) -> LlavaNextVision:
    """The tower, projector and image_newline of a LlavaNextForConditionalGeneration safetensors folder."""
    model = LlavaNextVision(json.loads((folder / "config.json").read_text()))
    wanted = set(model.state_dict())
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if key in _NEWLINE_KEYS:
                    state["image_newline"] = handle.get_tensor(key)
                    continue
                prefix = next((p for p in _PREFIXES if key.startswith(p[0])), None)
                if prefix is not None and (name := prefix[1] + key[len(prefix[0]) :]) in wanted:
                    state[name] = handle.get_tensor(key)
    model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    return model.to(dtype).eval()


def load_llava_next_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> LlavaNextVision:
    """The same from llama.cpp's LLaVA-NeXT `mlp` mmproj (config: gguf_vision_config's dict for the pair)."""
    model = LlavaNextVision(config)
    state = {name: torch.from_numpy(values) for name, values in read_llava_mmproj(config, mmproj).items()}
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a LLaVA-NeXT CLIP tower: {exc}") from exc
    return model.to(dtype).eval()
