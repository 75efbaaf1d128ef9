"""Qwen2.5-VL and Qwen3-VL image input (#29) against transformers on tiny random checkpoints, fp32: the
preprocessing equals transformers' Qwen2VLImageProcessorPil bit for bit on real PNG/JPEG files, and the
vision towers' outputs (with Qwen3-VL's DeepStack features) equal get_image_features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from localchat.backends.torch.vision.qwen_vl import encode_image, load_qwen_vision
from localchat.vision.qwen_vl_preprocess import QwenImageSpec, preprocess_qwen, smart_resize
from tests.helpers import qwen_vl_models as tiny

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=tiny.KINDS)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, tiny.write_folder(request.param, folder), folder


def test_smart_resize_bounds() -> None:
    assert smart_resize(70, 100, 28, 56 * 56, 120 * 120) == (56, 112)  # round half to even, as the processor
    h, w = smart_resize(1000, 3000, 28, 56 * 56, 28 * 28 * 100)
    assert h % 28 == w % 28 == 0 and h * w <= 28 * 28 * 100
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(2, 1000, 28, 56 * 56, 120 * 120)


def test_preprocessing_equals_transformers(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    kind, _, folder = saved
    config = __import__("json").loads((folder / "config.json").read_text())
    spec = QwenImageSpec.from_folder(folder, config["vision_config"])
    extra = tmp_path / "rgba.png"  # transparency composited on white, as the processor does
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (60, 61, 4), dtype=np.uint8), "RGBA").save(
        extra
    )
    for path in [*tiny.pictures(tmp_path), extra]:
        ours, grid = preprocess_qwen(Image.open(path), spec)
        theirs = tiny.image_processor(kind)(Image.open(path), return_tensors="np")
        assert grid == tuple(theirs["image_grid_thw"][0])
        assert np.array_equal(ours, theirs["pixel_values"]), path.name  # bit for bit


def test_tower_equals_get_image_features(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    kind, hf, folder = saved
    tower = load_qwen_vision(folder)
    assert tower is not None
    outs = []
    for path in tiny.pictures(tmp_path):
        ref = tiny.image_processor(kind)(Image.open(path), return_tensors="pt")
        grid = tuple(int(g) for g in ref["image_grid_thw"][0])
        with torch.no_grad():
            ours = encode_image(tower, ref["pixel_values"].numpy(), grid)  # type: ignore[arg-type]
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"]
            )
        main = theirs.pooler_output
        main = torch.cat(list(main)) if isinstance(main, (list, tuple)) else main
        stacked = [torch.cat(list(f)) if isinstance(f, (list, tuple)) else f for f in _deepstack(theirs)]
        blocks = [main, *stacked]
        expected = torch.cat(blocks, dim=-1)
        assert ours.shape == expected.shape == (grid[1] * grid[2] // 4, 64 * tower.stacked)
        err = (ours - expected).abs().max().item()
        print(f"{kind} tower max abs err fp32 ({grid}): {err:.2e}")
        assert err < 1e-5
        outs.append(ours)
    assert tower.stacked == (3 if kind == "qwen3_vl" else 1)
    same = outs[0].shape == outs[1].shape and (outs[0] - outs[1]).abs().max().item() < 1e-2
    assert not same  # different pictures, different embeddings


def _deepstack(output: object) -> list[Any]:
    features = getattr(output, "deepstack_features", None)
    return list(features) if features else []


def _hf_greedy(hf: Any, prompt: list[int], ref: Any, new: int) -> list[int]:
    """transformers' greedy tokens, a full forward per token (its own 3-D positions each time)."""
    tokens = list(prompt)
    for _ in range(new):
        ids = torch.tensor([tokens])
        with torch.no_grad():
            logits = hf(
                input_ids=ids,
                pixel_values=ref["pixel_values"],
                image_grid_thw=ref["image_grid_thw"],
                mm_token_type_ids=(ids == tiny.IMAGE).int(),
            ).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :]


@pytest.fixture(scope="module")
def moe_saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    folder = tmp_path_factory.mktemp("qwen3_5_moe")
    return "qwen3_5_moe", tiny.write_folder("qwen3_5_moe", folder), folder


def test_qwen3_5_moe_engine_greedy_equals_transformers(
    moe_saved: tuple[str, Any, Path], tmp_path: Path
) -> None:
    """Qwen3.5-MoE's wrapper: the same tower and hybrid text path with sparse experts."""
    test_engine_greedy_equals_transformers(moe_saved, tmp_path, 7)


@pytest.mark.parametrize("chunk", [0, 7])
def test_engine_greedy_equals_transformers(saved: tuple[str, Any, Path], tmp_path: Path, chunk: int) -> None:
    """Through LLMEngine + TorchRunner: M-RoPE positions, the scatter (and DeepStack), a prefill chunk
    boundary inside the image's run, then the same picture again from the prefix cache."""
    from localchat.vision.gemma3_preprocess import content_hash
    from localchat.vision.qwen_vl_prompt import QwenImagePrompt
    from localchat.weights.loader import load_model
    from tests.helpers.picture_parity import greedy_request, small_engine
    from tests.helpers.torch_models import fp32_runner

    kind, hf, folder = saved
    config = __import__("json").loads((folder / "config.json").read_text())
    prompt_side = QwenImagePrompt.from_config(folder, config)
    bundle = load_model(folder)
    engine = small_engine(fp32_runner(bundle), bundle.tokenizer, chunk, 128)

    def generate(path: Path) -> tuple[list[int], list[int], int]:
        pixels, grid = prompt_side.preprocess(Image.open(path))
        count = grid[0] * grid[1] * grid[2]
        prompt = [1, 3, 5, tiny.START, *[tiny.IMAGE] * count, tiny.END, 7, 9, 2, 1, 4]
        image = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, grid)])
        return prompt, *greedy_request(engine, prompt, image, 6)

    answers = []
    for path in tiny.pictures(tmp_path):
        prompt, ours, _ = generate(path)
        ref = tiny.image_processor(kind)(Image.open(path), return_tensors="pt")
        assert ours == _hf_greedy(hf, prompt, ref, 6), path.name
        _, repeat, cached = generate(path)  # a second turn: the prefix cache holds the picture's blocks
        assert repeat == ours
        if engine.prefix_caching_note:  # Qwen3.5's hybrid layers: no prefix reuse, the encoding is cached
            assert cached == 0 and engine.runner.images.cache.hits >= 1  # type: ignore[attr-defined]
        else:
            assert cached >= len(prompt) - 4
        answers.append(ours)
    assert answers[0] != answers[1]
    if chunk:  # the image's run starts at 4 and crosses the chunk boundary at 7
        assert engine.runner.images.cache.hits >= 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("chunk", [None, 7])
def test_prompt_logits_equal_transformers(
    saved: tuple[str, Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """Every prompt token's logits with a picture (whole, or split inside the image run by a chunk)."""
    from localchat.engine.interface import ImageSlice
    from localchat.vision.gemma3_preprocess import content_hash
    from localchat.vision.mrope import mrope_positions
    from localchat.vision.placement import chunk_rows
    from localchat.vision.qwen_vl_prompt import QwenImagePrompt
    from localchat.weights.loader import load_model
    from tests.helpers.torch_batch import PagedDriver
    from tests.helpers.torch_models import fp32_runner

    kind, hf, folder = saved
    config = __import__("json").loads((folder / "config.json").read_text())
    prompt_side = QwenImagePrompt.from_config(folder, config)
    path = tiny.pictures(tmp_path)[0]
    pixels, grid = prompt_side.preprocess(Image.open(path))
    count = grid[0] * grid[1] * grid[2]
    prompt = [1, 3, 5, tiny.START, *[tiny.IMAGE] * count, tiny.END, 7, 9, 2, 1, 4]
    (image,) = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, grid)])
    driver = PagedDriver(fp32_runner(load_model(folder)))
    driver.add("a", prompt)
    pieces = []
    for start, end in [(0, len(prompt))] if chunk is None else [(0, chunk), (chunk, len(prompt))]:
        out, batch = driver.build({"a": end - start}, every_token=True)
        rows, picked = chunk_rows(list(image.placeholders), start, end)
        batch.image_slices = [ImageSlice(image, rows, picked)] if rows else []
        batch.rope_positions = mrope_positions([image], start, end)
        pieces.append(driver.runner.compute_logits(out, batch).numpy())
    ours = np.concatenate(pieces)
    ref = tiny.image_processor(kind)(Image.open(path), return_tensors="pt")
    ids = torch.tensor([prompt])
    with torch.no_grad():
        theirs = hf(
            input_ids=ids,
            pixel_values=ref["pixel_values"],
            image_grid_thw=ref["image_grid_thw"],
            mm_token_type_ids=(ids == tiny.IMAGE).int(),
        ).logits[0]
    err = float(np.abs(ours - theirs.numpy()).max())
    print(f"{kind} image prompt logits max abs err fp32 (chunk={chunk}): {err:.2e}")
    assert err < 1e-4
    # the positions matter: with 1-D positions (no M-RoPE) the logits leave transformers'
    plain = PagedDriver(driver.runner)
    plain.add("b", prompt)
    out, batch = plain.build(every_token=True)
    batch.image_slices = [ImageSlice(image, list(image.placeholders), list(range(count)))]
    flat = plain.runner.compute_logits(out, batch).numpy()
    assert float(np.abs(flat - theirs.numpy()).max()) > 1e-3


def test_mrope_positions_equal_get_rope_index(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    """Two pictures of different grids with text between and after: localchat's positions (any span)
    equal transformers' get_rope_index."""
    from localchat.vision.mrope import mrope_positions
    from localchat.vision.qwen_vl_prompt import QwenImagePrompt

    kind, hf, folder = saved
    config = __import__("json").loads((folder / "config.json").read_text())
    prompt_side = QwenImagePrompt.from_config(folder, config)
    paths = tiny.pictures(tmp_path)
    prepared = [(p.name, *prompt_side.preprocess(Image.open(p))) for p in paths]
    prompt = [1, 3]
    for _, _, grid in prepared:
        prompt += [tiny.START, *[tiny.IMAGE] * (grid[1] * grid[2]), tiny.END, 5, 6]
    images = prompt_side.inputs(prompt, prepared)
    refs = [tiny.image_processor(kind)(Image.open(p), return_tensors="pt") for p in paths]
    ids = torch.tensor([prompt])
    theirs, _ = hf.model.get_rope_index(
        ids,
        mm_token_type_ids=(ids == tiny.IMAGE).int(),
        image_grid_thw=torch.cat([r["image_grid_thw"] for r in refs]),
    )
    assert np.array_equal(mrope_positions(images, 0, len(prompt)), theirs[:, 0].numpy())
    assert np.array_equal(mrope_positions(images, 5, 17), theirs[:, 0, 5:17].numpy())
    # past the prompt (decode): index + the delta transformers keeps
    last = int(theirs[:, 0, -1].max())
    assert (mrope_positions(images, len(prompt), len(prompt) + 2) == [[last + 1, last + 2]] * 3).all()


def test_hub_layout_config_loads(tmp_path: Path) -> None:
    """Qwen2.5-VL's hub config.json keeps the text keys at the top level with rope_scaling
    {"type": "mrope", ...} and its preprocessor_config.json min/max_pixels: the same model loads from it."""
    import json
    import shutil

    from localchat.vision.model_info import takes_images
    from localchat.vision.qwen_vl_prompt import QwenImagePrompt
    from localchat.weights.loader import load_model

    folder = tmp_path / "hub"
    tiny.write_folder("qwen2_5_vl", folder)
    config = json.loads((folder / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**text, **config, "model_type": "qwen2_5_vl", "rope_theta": rope["rope_theta"]}
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    (folder / "config.json").write_text(json.dumps(flat))
    pixels = {"min_pixels": tiny.MIN_PIXELS, "max_pixels": tiny.MAX_PIXELS, "patch_size": 14, "merge_size": 2}
    (folder / "preprocessor_config.json").write_text(json.dumps(pixels))
    bundle = load_model(folder)
    assert bundle.config.model_type == "qwen2_5_vl_text"
    assert bundle.config.extra["mrope_section"] == [2, 3, 3] and bundle.config.rope_scaling is None
    assert takes_images(folder)
    spec = QwenImagePrompt.from_config(folder, flat).spec
    assert (spec.min_pixels, spec.max_pixels, spec.patch_size) == (tiny.MIN_PIXELS, tiny.MAX_PIXELS, 14)
    shutil.rmtree(folder)
