"""Gemma 3 as llama.cpp publishes it: a text GGUF plus its `mmproj-*.gguf` vision projector, both written
by llama.cpp's converter from the tiny random Gemma3ForConditionalGeneration the vision tests use. The
mmproj, paired automatically (the only one beside the model) or by --mmproj, gives transformers' image
embeddings, and the GGUF text model with them transformers' logits and greedy tokens for an image
prompt (token_type_ids as the processor passes them: the picture's tokens see each other both ways). An mmproj for another model is refused by a typed error naming both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from localchat.backends.torch.vision.gemma3_mmproj import load_gemma3_mmproj
from localchat.engine.request import ImageInput
from localchat.errors import ModelLoadError
from localchat.vision.gemma3_preprocess import ImageSpec, decode, preprocess
from localchat.vision.mmproj import MmprojMismatchError, gguf_vision_config, pair_mmproj
from localchat.vision.model_info import takes_images, vision_config
from localchat.weights.loader import load_model
from tests.e2e.test_vision_server import TOKENS_PER_IMAGE, _write_folder
from tests.helpers.gemma3_gguf_vision import write_gguf_pair
from tests.helpers.picture_parity import REQ, assert_prefill_and_greedy
from tests.helpers.picture_prefill import prefill_logits
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow

Pair = tuple[Any, Path, Path, Path]  # (transformers model, folder, text GGUF, mmproj GGUF)


def round_projection_to_f16(hf: Any, folder: Path) -> None:
    """llama.cpp's converter keeps the projector matrix in f16 whatever --outtype says: weights already
    f16-exact make the f32 GGUF pair the same model as the folder, so the comparison can be tight."""
    with torch.no_grad():
        weight = hf.model.multi_modal_projector.mm_input_projection_weight
        weight.copy_(weight.half().float())
    hf.save_pretrained(folder)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    folder = tmp_path_factory.mktemp("gemma3v-folder")
    hf = _write_folder(folder, query_pre_attn_scalar=16)  # llama.cpp's gemma3 scales by head_dim**-0.5
    round_projection_to_f16(hf, folder)
    model, mmproj = write_gguf_pair(folder, tmp_path_factory.mktemp("gemma3v-gguf"), TOKENS_PER_IMAGE)
    return hf, folder, model, mmproj


def _pixels(tmp_path: Path) -> torch.Tensor:
    rng = np.random.default_rng(3)
    pictures = []
    for i, shape in enumerate(((40, 70, 3), (90, 33, 3))):
        path = tmp_path / f"p{i}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "RGB").save(path)
        pictures.append(preprocess(decode(path.read_bytes()), ImageSpec(size=56)))
    return torch.from_numpy(np.stack(pictures))


def test_the_only_mmproj_beside_the_model_is_paired(pair: Pair) -> None:
    _, _, model, mmproj = pair
    assert pair_mmproj(model) == mmproj.resolve()
    config = vision_config(model)
    assert config is not None and takes_images(model)
    assert config["mm_tokens_per_image"] == TOKENS_PER_IMAGE and config["image_token_index"] == 299
    assert config["vision_config"]["image_size"] == 56 and config["vision_config"]["patch_size"] == 14


def test_mmproj_named_by_the_setting_is_paired_from_anywhere(pair: Pair, tmp_path: Path) -> None:
    """--mmproj (load_model's `mmproj`): the projector need not sit beside the model."""
    _, _, model, mmproj = pair
    (tmp_path / "model").mkdir()
    (tmp_path / "proj").mkdir()
    alone, elsewhere = tmp_path / "model" / model.name, tmp_path / "proj" / "vision.gguf"
    alone.write_bytes(model.read_bytes())
    elsewhere.write_bytes(mmproj.read_bytes())
    assert not takes_images(alone)
    load_model(alone, mmproj=elsewhere)
    assert takes_images(alone) and pair_mmproj(alone) == elsewhere
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(alone, mmproj=tmp_path / "missing.gguf")


def test_the_ram_estimate_counts_the_paired_mmproj(pair: Pair, tmp_path: Path) -> None:
    from localchat.models.memory import estimate

    _, _, model, mmproj = pair
    alone = tmp_path / model.name
    alone.write_bytes(model.read_bytes())
    size = mmproj.stat().st_size
    assert estimate(model, 64).weights - estimate(alone, 64).weights == size  # bf16: as stored in f16
    assert (
        estimate(model, 64, dtype="float32").weights - estimate(alone, 64, dtype="float32").weights
        == 2 * size
    )


def test_mmproj_embeddings_match_transformers(pair: Pair, tmp_path: Path) -> None:
    hf, _, model, mmproj = pair
    vision = load_gemma3_mmproj(gguf_vision_config(model, mmproj), mmproj)
    pixels = _pixels(tmp_path)
    ours = vision.encode(pixels)
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output
    err = (ours - theirs).abs().max().item()
    print(f"gemma3 mmproj image embeddings max abs err fp32: {err:.2e}")
    assert ours.shape == theirs.shape and err < 1e-4
    assert (ours[0] - ours[1]).abs().max().item() > 1e-2


def test_gguf_with_mmproj_answers_an_image_prompt_as_transformers(pair: Pair, tmp_path: Path) -> None:
    """The runner encodes the picture with the paired mmproj and attends over its tokens both ways, as
    transformers does with the token_type_ids Gemma3Processor passes."""
    hf, _, model, _ = pair
    bundle = load_model(model)  # pairs the mmproj beside it
    pixels = _pixels(tmp_path)[:1]
    prompt = [2, 3, 5, 7, 297, 299, 299, 299, 299, 298, 4, 3, 6]
    image = ImageInput(tuple(i for i, t in enumerate(prompt) if t == 299), "picture", pixels[0].numpy())
    runner = fp32_runner(bundle)
    assert runner.pictures_both_ways
    driver = PagedDriver(runner)

    def reference(tokens: list[int]) -> np.ndarray:
        ids = torch.tensor([tokens])
        with torch.no_grad():
            out = hf(input_ids=ids, pixel_values=pixels, token_type_ids=(ids == 299).long())
        return out.logits[0].float().numpy()

    assert_prefill_and_greedy(
        driver,
        prompt,
        [(0, len(prompt))],
        lambda start, end: prefill_logits(runner, driver, REQ, image, [(start, end)]),
        reference,
        "gemma3 GGUF + mmproj",
        greedy=4,
        atol=1e-3,
    )


@pytest.mark.parametrize(
    ("model_type", "hidden", "named"),
    [("llama", 64, ("'gemma3'", "'llama'")), ("gemma3_text", 32, ("width 64", "hidden size 32"))],
)
def test_a_mismatched_mmproj_is_a_typed_error(
    pair: Pair,
    tmp_path: Path,
    model_type: str,
    hidden: int,
    named: tuple[str, str],
) -> None:
    """An mmproj given for another model (another architecture, or a Gemma 3 of another width) is
    refused at load naming both files and what differs; found beside it, the same."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
    from tests.helpers.torch_models import tiny_hf_model

    _, _, _, mmproj = pair
    hf = tiny_hf_model(model_type, vocab_size=TINY_VOCAB_SIZE, hidden_size=hidden, head_dim=16)
    other = write_tiny_gguf(tmp_path / "other.gguf", hf, qtype="F32")
    with pytest.raises(MmprojMismatchError) as info:
        load_model(other, mmproj=mmproj)
    message = info.value.message
    assert "other.gguf" in message and mmproj.name in message and all(n in message for n in named)
    beside = tmp_path / "beside"
    beside.mkdir()
    (beside / "other.gguf").write_bytes(other.read_bytes())
    (beside / mmproj.name).write_bytes(mmproj.read_bytes())
    with pytest.raises(MmprojMismatchError):
        load_model(beside / "other.gguf")
    assert not takes_images(beside / "other.gguf")
