"""Which model folders take images (#29), from config.json alone."""

from __future__ import annotations

import json
from pathlib import Path

from localchat.vision.model_info import takes_images


def test_supported_families_with_a_vision_config_take_images_others_do_not(tmp_path: Path) -> None:
    def folder(name: str, config: dict[str, object]) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        return path

    assert takes_images(folder("g3", {"model_type": "gemma3", "vision_config": {"image_size": 896}}))
    assert not takes_images(folder("g3text", {"model_type": "gemma3_text"}))
    assert takes_images(folder("llava", {"model_type": "llava", "vision_config": {}}))
    assert takes_images(folder("qwen25vl", {"model_type": "qwen2_5_vl", "vision_config": {}}))
    assert takes_images(folder("llavanext", {"model_type": "llava_next", "vision_config": {}}))
    assert not takes_images(folder("q35text", {"model_type": "qwen3_5"}))  # text-only checkpoint
    assert not takes_images(tmp_path / "model.gguf")


def _safetensors(path: Path, names: list[str]) -> None:
    """A safetensors file whose header names `names` (one f32 value each): what the check reads."""
    header = {
        name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        for i, name in enumerate(names)
    }
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * (4 * len(names)))


def test_a_text_only_export_of_a_multimodal_config_does_not_take_images(tmp_path: Path) -> None:
    """Community text-only exports keep Gemma3ForConditionalGeneration's config but drop the tower: the
    listing and the API must not promise pictures the runner has no tower for."""
    config = {"model_type": "gemma3", "vision_config": {"image_size": 896}}
    with_tower, text_only, sharded = tmp_path / "full", tmp_path / "text", tmp_path / "sharded"
    for folder in (with_tower, text_only, sharded):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    _safetensors(
        with_tower / "model.safetensors", ["language_model.embed.weight", "vision_tower.patch.weight"]
    )
    _safetensors(
        text_only / "model.safetensors", ["language_model.embed.weight", "language_model.norm.weight"]
    )
    index = {"weight_map": {"model.visual.blocks.0.weight": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert takes_images(with_tower) and takes_images(sharded)
    assert not takes_images(text_only)
