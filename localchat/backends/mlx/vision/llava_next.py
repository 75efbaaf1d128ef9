"""The MLX twin of backends/torch/vision/llava_next.py: LLaVA 1.5's tower and projector (llava.py here) on
the whole picture and each anyres tile, the tiles' feature grids stitched, cropped to the picture and
ended row by row with `image_newline`; the whole picture's rows first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx

from localchat.backends.mlx.vision.llava import LlavaVision, _expected_names, _our_name
from localchat.vision.llava_mmproj import read_llava_mmproj
from localchat.vision.llava_next_prompt import DEFAULT_PINPOINTS, best_resolution, unpadded_bounds

_NEWLINE_KEYS = ("model.image_newline", "image_newline")


class LlavaNextVision(LlavaVision):
    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        if config.get("vision_feature_select_strategy", "default") != "default":
            # the tiles' CLS rows would break their patch grids (transformers cannot run it either)
            raise ValueError("LLaVA-NeXT runs only vision_feature_select_strategy 'default'")
        super().__init__(config, weights)
        self.pinpoints = tuple(
            (int(h), int(w)) for h, w in config.get("image_grid_pinpoints", DEFAULT_PINPOINTS)
        )
        self.tile = int(config["vision_config"]["image_size"])

    def encode_anyres(self, tiles: mx.array, image_size: tuple[int, int]) -> mx.array:
        """[1 + tiles, 3, S, S] (the whole picture first) -> the picture's embedding rows [tokens, hidden]."""
        features = self.encode(tiles)  # [1 + tiles, grid * grid, hidden]
        target = best_resolution(image_size, self.pinpoints)
        tile_rows, tile_columns = target[0] // self.tile, target[1] // self.tile
        g, hidden = self.grid, features.shape[-1]
        grid = features[1:].reshape(tile_rows, tile_columns, g, g, hidden).transpose(0, 2, 1, 3, 4)
        grid = grid.reshape(tile_rows * g, tile_columns * g, hidden)
        top, bottom, left, right = unpadded_bounds(image_size, (tile_rows * g, tile_columns * g))
        grid = grid[top:bottom, left:right]
        newline = mx.broadcast_to(self.w["image_newline"].astype(grid.dtype), (grid.shape[0], 1, hidden))
        rows = mx.concatenate([grid, newline], axis=1).reshape(-1, hidden)
        return mx.concatenate([features[0], rows])


def load_llava_next_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> LlavaNextVision:
    """The tower, projector and image_newline of a LlavaNextForConditionalGeneration safetensors folder."""
    config = json.loads((folder / "config.json").read_text())
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        for key, value in loaded.items():
            name = "image_newline" if key in _NEWLINE_KEYS else _our_name(key)
            if name is not None:
                weights[name] = value.astype(dtype)
    return _checked(config, weights, folder)


def load_llava_next_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: mx.Dtype = mx.float32
) -> LlavaNextVision:
    """The same from llama.cpp's LLaVA-NeXT `mlp` mmproj (config: gguf_vision_config's dict for the pair)."""
    state = read_llava_mmproj(config, mmproj)
    return _checked(config, {name: mx.array(v).astype(dtype) for name, v in state.items()}, mmproj)


def _checked(config: dict[str, Any], weights: dict[str, mx.array], source: Path) -> LlavaNextVision:
    wanted = _expected_names(config) | {"image_newline"}
    kept = {name: value for name, value in weights.items() if name in wanted}
    mx.eval(list(kept.values()))  # evaluated now: nothing lazy stays bound to the loading thread's stream
    missing = wanted - kept.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{source}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    return LlavaNextVision(config, kept)
