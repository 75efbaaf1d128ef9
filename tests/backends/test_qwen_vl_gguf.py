"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL as llama.cpp publishes them (#29): a `qwen2vl` / `qwen3vl` text GGUF
and its mmproj GGUF, both written by llama.cpp's own convert_hf_to_gguf.py from tiny random transformers
checkpoints, against transformers in fp32: text-only logits, the pairing's config, the mmproj tower's
embeddings (DeepStack included) against get_image_features, every prompt token's logits with a picture
(M-RoPE sections from `rope.dimension_sections`), and greedy tokens through the engine with a prefill
chunk boundary inside the image's run and a second turn from the prefix cache."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from localchat.vision.gemma3_preprocess import content_hash
from localchat.vision.model_info import takes_images, vision_config
from localchat.vision.qwen_vl_prompt import QwenImagePrompt
from localchat.weights.loader import load_model
from tests.helpers import qwen_vl_gguf as pair
from tests.helpers import qwen_vl_models as tiny
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow
_TOWER = {"qwen3_vl_moe": "qwen3_vl"}  # the pair's model type: its tower's
_FOLDERS: dict[str, Path] = {}  # each kind's transformers folder, for conversions of its own


@pytest.fixture(scope="module", params=pair.KINDS)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    """(kind, transformers model, text GGUF) with its mmproj beside it."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = pair.write_folder(request.param, folder)
    _FOLDERS[request.param] = folder
    model, _ = pair.write_gguf_pair(folder, tmp_path_factory.mktemp(f"{request.param}-gguf"))
    return request.param, hf, model


def _prompt_side(model: Path) -> QwenImagePrompt:
    config = vision_config(model)
    assert config is not None
    return QwenImagePrompt.from_config(model, config)


def _reference(kind: str, prompt_side: QwenImagePrompt, path: Path) -> Any:
    spec = prompt_side.spec
    return pair.reference_processor(kind, spec.min_pixels, spec.max_pixels)(
        Image.open(path), return_tensors="pt"
    )


def _hf_logits(hf: Any, prompt: list[int], ref: Any | None) -> torch.Tensor:
    ids = torch.tensor([prompt])
    extra = {} if ref is None else {
        "pixel_values": ref["pixel_values"],
        "image_grid_thw": ref["image_grid_thw"],
        "mm_token_type_ids": (ids == tiny.IMAGE).int(),
    }  # fmt: skip
    with torch.no_grad():
        return hf(input_ids=ids, **extra).logits[0]


def test_text_logits_equal_transformers(saved: tuple[str, Any, Path]) -> None:
    """Text only: the `qwen2vl` / `qwen3vl` architecture loads as the family's text model."""
    kind, hf, model = saved
    bundle = load_model(model)
    text_types = {"qwen3_vl": "qwen3_vl_text", "qwen3_5": "qwen3_5_text", "qwen3_vl_moe": "qwen3_vl_moe_text"}
    assert bundle.config.model_type == text_types.get(kind, "qwen2_vl_text")
    sections = [3, 3, 2] if kind == "qwen3_5" else [2, 3, 3]
    assert list(bundle.config.extra["mrope_section"])[:3] == sections
    assert bundle.config.extra["mrope_interleaved"] == kind.startswith("qwen3")
    prompt = [1, 3, 5, 7, 9, 2, 1, 4, 100, 200, 250, 17]
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", prompt)
    out, batch = driver.build(every_token=True)
    ours = driver.runner.compute_logits(out, batch).numpy()
    err = float(np.abs(ours - _hf_logits(hf, prompt, None).numpy()).max())
    print(f"{kind} GGUF text logits max abs err fp32: {err:.2e}")
    assert err < 1e-4


def test_pairing_config(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    """The mmproj beside the GGUF pairs: the tower's settings the file records or llama.cpp assumes, and
    preprocessing that equals transformers' processor bit for bit under llama.cpp's pixel bounds."""
    kind, _, model = saved
    config = vision_config(model)
    assert config is not None and takes_images(model)
    assert config["model_type"] == _TOWER.get(kind, kind) and config["image_token_id"] == tiny.IMAGE
    vision = config["vision_config"]
    if kind == "qwen2_5_vl":
        assert vision["window_size"] == 112 and vision["fullatt_block_indexes"] == [1, 3]
    if kind in ("qwen3_vl", "qwen3_vl_moe"):
        assert vision["deepstack_visual_indexes"] == [0, 2] and vision["num_position_embeddings"] == 36
    if kind == "qwen3_5":  # Qwen3-VL's projector kind, its tower without DeepStack
        assert vision["deepstack_visual_indexes"] == [] and vision["num_position_embeddings"] == 36
    prompt_side = _prompt_side(model)
    token_px = (prompt_side.spec.patch_size * 2) ** 2
    assert (prompt_side.spec.min_pixels, prompt_side.spec.max_pixels) == (8 * token_px, 4096 * token_px)
    for path in pair.pictures(tmp_path):
        ours, grid = prompt_side.preprocess(Image.open(path))
        theirs = _reference(kind, prompt_side, path)
        assert tuple(int(g) for g in theirs["image_grid_thw"][0]) == (1, grid[1] * 2, grid[2] * 2)
        assert np.array_equal(ours, theirs["pixel_values"].numpy()), path.name


def test_mmproj_tower_equals_get_image_features(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    from localchat.backends.torch.vision.qwen_vl import encode_image
    from localchat.backends.torch.vision.qwen_vl_mmproj import load_qwen_vl_mmproj

    kind, hf, model = saved
    config = vision_config(model)
    assert config is not None
    tower = load_qwen_vl_mmproj(config, Path(config["mmproj"]))
    prompt_side = _prompt_side(model)
    for path in pair.pictures(tmp_path):
        ref = _reference(kind, prompt_side, path)
        grid = tuple(int(g) for g in ref["image_grid_thw"][0])
        with torch.no_grad():
            ours = encode_image(tower, ref["pixel_values"].numpy(), grid)  # type: ignore[arg-type]
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"]
            )
        blocks = [theirs.pooler_output, *(getattr(theirs, "deepstack_features", None) or [])]
        expected = torch.cat([torch.cat(list(b)) if isinstance(b, (list, tuple)) else b for b in blocks], -1)
        assert ours.shape == expected.shape == (grid[1] * grid[2] // 4, 64 * tower.stacked)
        err = (ours - expected).abs().max().item()
        print(f"{kind} mmproj tower max abs err fp32 ({grid}): {err:.2e}")
        assert err < 1e-5
    assert tower.stacked == (3 if kind in ("qwen3_vl", "qwen3_vl_moe") else 1)


def _image_prompt(count: int) -> list[int]:
    return [1, 3, 5, tiny.START, *[tiny.IMAGE] * count, tiny.END, 7, 9, 2, 1, 4]


@pytest.mark.parametrize("chunk", [None, 7])
def test_prompt_logits_equal_transformers(
    saved: tuple[str, Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """Every prompt token's logits with a picture, whole or split inside the image's run: the scatter,
    DeepStack and M-RoPE with the GGUF's sections."""
    from localchat.engine.interface import ImageSlice
    from localchat.vision.mrope import mrope_positions
    from localchat.vision.placement import chunk_rows

    kind, hf, model = saved
    prompt_side = _prompt_side(model)
    path = pair.pictures(tmp_path)[0]
    pixels, grid = prompt_side.preprocess(Image.open(path))
    prompt = _image_prompt(grid[0] * grid[1] * grid[2])
    (image,) = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, grid)])
    driver = PagedDriver(fp32_runner(load_model(model)))
    driver.add("a", prompt)
    pieces = []
    for start, end in [(0, len(prompt))] if chunk is None else [(0, chunk), (chunk, len(prompt))]:
        out, batch = driver.build({"a": end - start}, every_token=True)
        rows, picked = chunk_rows(list(image.placeholders), start, end)
        batch.image_slices = [ImageSlice(image, rows, picked)] if rows else []
        batch.rope_positions = mrope_positions([image], start, end)
        pieces.append(driver.runner.compute_logits(out, batch).numpy())
    theirs = _hf_logits(hf, prompt, _reference(kind, prompt_side, path)).numpy()
    err = float(np.abs(np.concatenate(pieces) - theirs).max())
    print(f"{kind} GGUF image prompt logits max abs err fp32 (chunk={chunk}): {err:.2e}")
    assert err < 1e-4
    # the picture matters: without it transformers' logits are elsewhere
    assert float(np.abs(_hf_logits(hf, prompt, None).numpy() - theirs).max()) > 1e-3
    # so do the GGUF's M-RoPE sections: with 1-D positions the logits leave transformers'
    plain = PagedDriver(driver.runner)
    plain.add("b", prompt)
    out, batch = plain.build(every_token=True)
    batch.image_slices = [ImageSlice(image, list(image.placeholders), list(range(len(image.placeholders))))]
    assert float(np.abs(plain.runner.compute_logits(out, batch).numpy() - theirs).max()) > 1e-3


@pytest.mark.parametrize("chunk", [0, 7])
def test_engine_greedy_equals_transformers(saved: tuple[str, Any, Path], tmp_path: Path, chunk: int) -> None:
    """Through LLMEngine + TorchRunner with the paired mmproj loaded by the runner: transformers' greedy
    tokens for two pictures, then the same picture again from the prefix cache."""
    from tests.helpers.picture_parity import greedy_request, hf_greedy, small_engine

    kind, hf, model = saved
    prompt_side = _prompt_side(model)
    bundle = load_model(model)
    engine = small_engine(fp32_runner(bundle), bundle.tokenizer, chunk, 256)
    assert engine.runner.images is not None  # type: ignore[attr-defined]

    def generate(path: Path) -> tuple[list[int], list[int], int]:
        pixels, grid = prompt_side.preprocess(Image.open(path))
        prompt = _image_prompt(grid[0] * grid[1] * grid[2])
        image = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, grid)])
        return prompt, *greedy_request(engine, prompt, image, 5)

    answers = []
    for path in pair.pictures(tmp_path):
        prompt, ours, _ = generate(path)
        ref = _reference(kind, prompt_side, path)
        assert ours == hf_greedy(partial(_hf_logits, hf, ref=ref), prompt, 5), path.name
        _, repeat, cached = generate(path)
        assert repeat == ours
        if engine.prefix_caching_note:  # Qwen3.5's hybrid layers: no prefix reuse, the encoding is cached
            assert cached == 0 and engine.runner.images.cache.hits >= 1  # type: ignore[attr-defined]
        else:
            assert cached >= len(prompt) - 4
        answers.append(ours)
    assert answers[0] != answers[1]


def test_wrong_projector_is_refused(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    """The Qwen-VL mmproj named for a llama GGUF: a typed error naming both architectures; the Qwen-VL
    GGUF with no mmproj beside it: a text model."""
    from localchat.vision.mmproj import MmprojMismatchError
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
    from tests.helpers.torch_models import tiny_hf_model

    kind, _, model = saved
    if kind != "qwen2_5_vl":
        pytest.skip("one kind is enough")
    mmproj = next(model.parent.glob("mmproj-*.gguf"))
    llama = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=64, head_dim=16)
    with pytest.raises(MmprojMismatchError, match=r"qwen2\.5vl_merger.*'llama'"):
        load_model(write_tiny_gguf(tmp_path / "llama.gguf", llama, qtype="F32"), mmproj=mmproj)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(model, alone / model.name)
    assert vision_config(alone / model.name) is None and not takes_images(alone / model.name)


def test_quantized_mmproj_loads(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    """A Q8_0 mmproj (the converter keeps the norms, biases and odd-sized matrices in f32) is dequantized
    on load: the tower's rows stay close to the f32 file's, and do move (the file is really quantized)."""
    from localchat.backends.torch.vision.qwen_vl import encode_image
    from localchat.backends.torch.vision.qwen_vl_mmproj import load_qwen_vl_mmproj
    from localchat.vision.mmproj import gguf_vision_config

    kind, _, model = saved
    if kind != "qwen3_vl":
        pytest.skip("one kind is enough")
    q8 = pair.write_mmproj(_FOLDERS[kind], tmp_path / "mmproj-q8_0.gguf", "q8_0")
    config = gguf_vision_config(model, q8)
    f32 = vision_config(model)
    assert f32 is not None
    prompt_side = _prompt_side(model)
    pixels, grid = prompt_side.preprocess(Image.open(pair.pictures(tmp_path)[0]))
    patch_grid = (1, grid[1] * 2, grid[2] * 2)
    with torch.no_grad():
        ours = encode_image(load_qwen_vl_mmproj(config, q8), pixels, patch_grid)
        exact = encode_image(load_qwen_vl_mmproj(f32, Path(f32["mmproj"])), pixels, patch_grid)
    err = float((ours - exact).abs().max() / exact.abs().max())
    print(f"{kind} Q8_0 mmproj tower max rel err vs f32: {err:.2e}")
    assert 0 < err < 0.05
