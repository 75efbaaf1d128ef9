"""Gemma 4 GGUF + llama.cpp's `gemma4v` mmproj on torch: the tiny random Gemma4ForConditionalGeneration of
tests/backends/test_gemma4_vision.py goes through llama.cpp's own converter (`--mmproj`, which writes the
vision tower + embedder with `clip.vision.projector_type` gemma4v), and
- the projector's tower gives transformers' image embeddings (fp32) on real picture files;
- a Gemma 4 text GGUF beside it (metadata and vocabulary written with gguf-py: the pairing reads no
  weights) pairs with it: the config says gemma4 with the `<|image|>` id and the tower's shape read off the
  tensors, the runner's embedder loads the mmproj tower, and a request's pictures expand as a folder's do;
- a projector tensor the tower does not know is refused, not dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.torch.vision.gemma4 import Gemma4Vision
from localchat.backends.torch.vision.gemma4_mmproj import load_gemma4_mmproj
from localchat.backends.torch.vision.images import load_image_embedder
from localchat.errors import ModelLoadError
from localchat.vision.content import ImageLimits
from localchat.vision.gemma3_preprocess import decode
from localchat.vision.gemma4_mmproj import gemma4_tensors
from localchat.vision.gemma4_preprocess import Gemma4ImageSpec, preprocess
from localchat.vision.gemma4_prompt import Gemma4ImagePrompt
from localchat.vision.mmproj import gguf_vision_config
from localchat.vision.request_images import prepare_images
from tests.helpers.gemma4_gguf_vision import write_gguf_pair
from tests.helpers.gemma4_vision_models import (
    IMAGE_SPECIALS,
    image_processor,
    pictures,
    tokenizer,
)

IMAGE = IMAGE_SPECIALS["<|image|>"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """(transformers' model, text GGUF, mmproj GGUF) in one folder, as llama.cpp publishes them."""
    return write_gguf_pair(tmp_path_factory.mktemp("gemma4v-src"), tmp_path_factory.mktemp("gemma4v-gguf"))


def test_the_mmproj_tower_gives_transformers_embeddings(pair: tuple[Any, Path, Path], tmp_path: Path) -> None:
    hf, model, mmproj = pair
    config = gguf_vision_config(model, mmproj)
    vision = config["vision_config"]
    assert (config["model_type"], config["image_token_id"]) == ("gemma4", IMAGE)
    assert (vision["head_dim"], vision["num_key_value_heads"], vision["position_embedding_size"]) == (
        16,
        2,
        64,
    )
    assert vision["use_clipped_linears"] and vision["standardize"]
    tower = load_gemma4_mmproj(config, mmproj)
    spec = Gemma4ImageSpec(patch_size=4, max_soft_tokens=70)  # the folder's processor config
    for path in pictures(tmp_path):
        ref = image_processor()(decode(path.read_bytes()), return_tensors="pt")
        ours = tower.encode(torch.from_numpy(preprocess(decode(path.read_bytes()), spec))[None])[0]
        with torch.no_grad():
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_position_ids=ref["image_position_ids"]
            ).pooler_output[0]
        err = (ours - theirs).abs().max().item()
        print(f"gemma4 mmproj vision max abs err fp32: {err:.2e}")
        assert err < 1e-4


def test_the_pair_takes_pictures(pair: tuple[Any, Path, Path], tmp_path: Path) -> None:
    """The runner's embedder is the mmproj's tower; a request's picture becomes `<|image>` + its soft
    tokens + `<image|>` (the mmproj sets no processor config: 280 soft tokens at most, patch 4 here)."""
    _, model, _ = pair
    embedder = load_image_embedder(model, torch.device("cpu"), torch.float32)
    assert embedder is not None and isinstance(embedder.vision, Gemma4Vision)
    picture = pictures(tmp_path)[0]
    url = "file://" + str(picture)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    limits = ImageLimits(allow_local_files=True)
    prepared = prepare_images(messages, model, "tiny", limits)
    assert isinstance(prepared.prompt, Gemma4ImagePrompt)
    rows, columns = prepared.prompt.grid(prepared.pictures[0].pixels)
    text = prepared.expand("user <|image|> what ?")
    assert text == f"user <|image>{'<|image|>' * (rows * columns)}<image|> what ?"
    ids = list(tokenizer().encode(text, add_special_tokens=False).ids)
    (image,) = prepared.inputs(ids)
    assert len(image.placeholders) == rows * columns and ids[image.placeholders[0]] == IMAGE
    vision = embedder.vision
    assert isinstance(vision, Gemma4Vision)
    embeds = vision.encode(torch.from_numpy(np.asarray(image.pixels))[None])[0]
    assert embeds.shape == (rows * columns, 64)


def test_an_unknown_projector_tensor_is_refused(pair: tuple[Any, Path, Path], tmp_path: Path) -> None:
    import gguf

    _, _, mmproj = pair
    reader = gguf.GGUFReader(str(mmproj))
    odd = tmp_path / "mmproj-odd.gguf"
    writer = gguf.GGUFWriter(str(odd), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    for tensor in reader.tensors[:3]:
        writer.add_tensor(tensor.name, np.asarray(tensor.data))
    writer.add_tensor("v.blk.0.ls1.weight", np.ones(32, dtype=np.float32))  # a layer scale: not built
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"v\.blk\.0\.ls1\.weight.*without --mmproj"):
        gemma4_tensors(odd, gguf.GGUFReader(str(odd)).tensors)
