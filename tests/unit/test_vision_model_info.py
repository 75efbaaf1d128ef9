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
