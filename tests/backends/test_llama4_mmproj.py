"""A Llama 4 GGUF paired with llama.cpp's `llama4` mmproj, both written by llama.cpp's own converter from the
tiny random Llama4ForConditionalGeneration (tests/helpers/llama4_gguf.py): the pair is found, the model takes
pictures, the mmproj's tower gives transformers' features (get_image_features + the projector) and the
engine gives transformers' greedy tokens for a picture prompt, fp32."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer

from localchat.vision.llama4_prompt import Llama4ImagePrompt
from localchat.vision.model_info import takes_images, vision_config
from localchat.weights.loader import load_model
from tests.helpers import llama4_vision_models as tiny
from tests.helpers import picture_parity as picture
from tests.helpers.llama4_gguf import write_folder, write_gguf_pair
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow

# The chat template's layout with one-character words: the converter writes the word-level test vocabulary
# as a BPE one without merges, so the text GGUF spells only special tokens and single characters as the
# folder does (a multi-letter word like "user" is lost). The picture's tokens are all special.
CHAT = "<|begin_of_text|><|header_start|>?<|header_end|> <|image|>?<|eot|> <|header_start|>?<|header_end|> "


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path, Path]:
    """(transformers model, its folder, text GGUF, mmproj GGUF)."""
    folder = tmp_path_factory.mktemp("llama4")
    hf = write_folder(folder)
    model, mmproj = write_gguf_pair(folder, tmp_path_factory.mktemp("llama4-gguf"))
    return hf, folder, model, mmproj


def _prompt_side(path: Path) -> Llama4ImagePrompt:
    config = vision_config(path)
    assert config is not None
    return Llama4ImagePrompt.from_config(path, config)


def _hf_features(hf: Any, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        features = hf.get_image_features(pixel_values=pixels).last_hidden_state
        return hf.multi_modal_projector(features.reshape(-1, features.shape[-1]))


def test_pair_is_found_and_takes_images(saved: tuple[Any, Path, Path, Path]) -> None:
    _, _, model, mmproj = saved
    config = vision_config(model)  # the only mmproj beside the model: paired
    assert config is not None and config["model_type"] == "llama4" and config["mmproj"] == str(mmproj)
    assert config["image_token_index"] == tiny.PATCH_ID
    vision = config["vision_config"]
    assert (vision["pixel_shuffle_ratio"], vision["num_hidden_layers"]) == (0.5, 3)
    assert (vision["projector_input_dim"], vision["projector_output_dim"], vision["vision_output_dim"]) == (
        48,
        48,
        48,
    )
    assert takes_images(model)
    assert load_model(model).config.model_type == "llama4_text"


def test_mmproj_features_equal_transformers(saved: tuple[Any, Path, Path, Path], tmp_path: Path) -> None:
    from localchat.backends.torch.vision.llama4_mmproj import load_llama4_mmproj

    hf, folder, model, mmproj = saved
    config = vision_config(model)
    assert config is not None
    vision = load_llama4_mmproj(config, mmproj)
    side, folder_side = _prompt_side(model), _prompt_side(folder)
    for path in tiny.pictures(tmp_path):
        pixels, tiles = side.preprocess(Image.open(path))
        theirs_pixels, theirs_tiles = folder_side.preprocess(Image.open(path))
        assert tiles == theirs_tiles and np.array_equal(pixels, theirs_pixels)  # within llama.cpp's 3 x 3
        ours = vision.encode(torch.from_numpy(pixels)[None])[0]
        theirs = _hf_features(hf, torch.from_numpy(pixels))
        err = (ours - theirs).abs().max().item()
        print(f"llama4 mmproj features max abs err fp32 ({path.name}): {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-5


def _hf_logits(hf: Any, tokens: list[int], pixels: torch.Tensor) -> np.ndarray:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        embeds = hf.get_input_embeddings()(ids)
        mask = (ids == hf.config.image_token_id)[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(mask, _hf_features(hf, pixels).to(embeds.dtype))
        return hf.language_model(inputs_embeds=embeds).logits[0].float().numpy()


@pytest.mark.parametrize("chunk", [0, 50])
def test_gguf_pair_greedy_equals_transformers(
    saved: tuple[Any, Path, Path, Path], tmp_path: Path, chunk: int
) -> None:
    """The text GGUF (its converted tokenizer) with the paired mmproj through LLMEngine + TorchRunner:
    transformers' greedy tokens for two pictures, each twice (the second turn from the prefix cache, one
    encode per picture); chunk 50 splits the first tile."""
    from localchat.vision.gemma3_preprocess import content_hash

    hf, folder, model, _ = saved
    side = _prompt_side(model)
    bundle = load_model(model)
    runner = fp32_runner(bundle)
    assert runner.images is not None  # the tower came from the paired mmproj
    cases = []
    for path in tiny.pictures(tmp_path)[:2]:
        pixels, tiles = side.preprocess(Image.open(path))
        text = side.expand(CHAT, [tiles])
        prompt = list(bundle.tokenizer.encode(text))
        # the GGUF's tokenizer (converted by llama.cpp) gives the folder's ids
        assert prompt == Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids
        key = content_hash(path.read_bytes())
        reference = partial(_hf_logits, hf, pixels=torch.from_numpy(pixels))
        cases.append(
            picture.Case(
                path.name,
                prompt,
                partial(side.inputs, prompt, [(key, pixels, tiles)]),
                partial(picture.hf_greedy, reference, prompt, 5),
            )
        )
    picture.assert_twice_from_the_caches(picture.small_engine(runner, bundle.tokenizer, chunk, 512), cases, 5)


@pytest.mark.mlx
def test_mlx_gguf_pair_features_logits_and_greedy(
    saved: tuple[Any, Path, Path, Path], tmp_path: Path
) -> None:
    """The MLX runner of the text GGUF takes its tower from the paired mmproj: transformers' features, the
    picture prompt's logits (a chunk boundary inside the first tile) and three greedy tokens after it."""
    mx = pytest.importorskip("mlx.core")
    from localchat.vision.gemma3_preprocess import content_hash
    from tests.helpers.parity import Driver, mlx_runner

    hf, _, model, _ = saved
    side = _prompt_side(model)
    path = tiny.pictures(tmp_path)[0]
    pixels, tiles = side.preprocess(Image.open(path))
    bundle = load_model(model)
    prompt = list(bundle.tokenizer.encode(side.expand(CHAT, [tiles])))
    (image,) = side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, tiles)])
    runner = mlx_runner(bundle)
    assert runner.images is not None  # the tower came from the paired mmproj
    torch_pixels = torch.from_numpy(pixels)
    features = np.array(runner.images.vision.encode(mx.array(pixels)[None]))[0]
    err = np.abs(features - _hf_features(hf, torch_pixels).numpy()).max()
    print(f"mlx llama4 mmproj features max abs err fp32: {err:.2e}")
    assert err < 1e-4
    driver = Driver(runner)
    steps = [(0, 20), (20, len(prompt))]
    reference = partial(_hf_logits, hf, pixels=torch_pixels)
    label = "mlx llama4 mmproj"
    picture.assert_prefill_and_greedy(
        driver, prompt, steps, picture.image_slices(driver, image), reference, label
    )
    picture.assert_encoded_once(runner, image, steps)


def test_q8_0_mmproj_is_dequantized(saved: tuple[Any, Path, Path, Path], tmp_path: Path) -> None:
    """A Q8_0 mmproj (as some repos publish them) loads, dequantized, close to transformers' features."""
    from gguf import GGUFReader

    from localchat.backends.torch.vision.llama4_mmproj import load_llama4_mmproj
    from tests.helpers.qwen_vl_gguf import write_mmproj

    hf, folder, model, _ = saved
    q8 = write_mmproj(folder, tmp_path / "mmproj-q8_0.gguf", "q8_0")
    assert any(t.tensor_type.name == "Q8_0" for t in GGUFReader(q8).tensors)
    config = vision_config(model)
    assert config is not None
    vision = load_llama4_mmproj(config, q8)
    pixels, _ = _prompt_side(model).preprocess(Image.open(tiny.pictures(tmp_path)[0]))
    ours = vision.encode(torch.from_numpy(pixels)[None])[0]
    theirs = _hf_features(hf, torch.from_numpy(pixels))
    err = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    print(f"llama4 q8_0 mmproj features max err relative to the largest: {err:.2e}")
    assert err < 0.05
