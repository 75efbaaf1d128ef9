"""Pictures under `--tp 2` for Llama 4 and Mistral Small 4 (a Mistral3ForConditionalGeneration around
Mistral 4's MLA + MoE text model, with the Pixtral tower): every rank loads the vision tower whole and
encodes the step's pixels itself (docs/parallel.md says why), as for Qwen-VL and the LLaVA-style
models (test_tensor_parallel_llama_like.py). Tiny random transformers models, float32, gloo (2
processes): through LLMEngine with a prefill chunk boundary inside each picture's run, two pictures
give the one-device greedy tokens (and different answers: the picture matters). Planted bug: the
workers given other pixels (zeros) than rank 0 must change the answers, so the comparison would catch
a worker that does not see the step's picture."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import ModelRunner
from localchat.engine.request import ImageInput
from localchat.vision.gemma3_preprocess import content_hash
from localchat.vision.llama4_prompt import Llama4ImagePrompt
from localchat.vision.model_info import vision_config
from localchat.vision.pixtral_prompt import PixtralImagePrompt
from localchat.weights.loader import load_model
from tests.backends.test_pixtral_vision import _text_config, prompt_for
from tests.helpers import llama4_vision_models as llama4
from tests.helpers import picture_parity as picture
from tests.helpers import pixtral_models as pixtral
from tests.helpers.torch_models import exact_weights

EXACT = RunnerOptions(device="cpu", dtype="float32", num_threads=1)
NEW_TOKENS = 6
Requests = list[tuple[list[int], tuple[ImageInput, ...]]]  # each picture's prompt and its inputs


@dataclass(frozen=True)
class Family:
    """A folder's picture requests: `requests(tag)` gives each picture's prompt and fresh ImageInputs
    (`tag` goes into the content hash, so a run with other pixels is not served from an encoder cache)."""

    folder: Path
    requests: Callable[[str], Requests]
    chunk: int  # the prefill chunk: it ends inside each picture's run
    max_len: int


def _llama4(tmp_path: Path) -> Family:
    folder = tmp_path / "llama4"
    llama4.write_folder(folder)
    config = vision_config(folder)
    assert config is not None
    side = Llama4ImagePrompt.from_config(folder, config)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    paths = llama4.pictures(tmp_path)[:2]  # 2 x 3 and 3 x 2 tiles (+ the global one): 112 patch tokens

    def requests(tag: str) -> Requests:
        out: Requests = []
        for path in paths:
            pixels, tiles = side.preprocess(Image.open(path))
            text = "<|begin_of_text|><|header_start|>user<|header_end|> <|image|>what is in this picture ?"
            text += "<|eot|> <|header_start|>assistant<|header_end|> "
            prompt = list(tokenizer.encode(side.expand(text, [tiles])).ids)
            key = content_hash(path.read_bytes()) + tag
            out.append((prompt, tuple(side.inputs(prompt, [(key, pixels, tiles)]))))
        return out

    return Family(folder, requests, chunk=50, max_len=512)


def _mistral_small_4(tmp_path: Path) -> Family:
    folder = tmp_path / "mistral4"
    pixtral.write_folder(folder, _text_config("mistral4"))
    assert load_model(folder).config.model_type == "mistral4"
    config = vision_config(folder)
    assert config is not None
    side = PixtralImagePrompt.from_config(folder, config)
    paths = pixtral.pictures(tmp_path)[:2]

    def requests(tag: str) -> Requests:
        out: Requests = []
        for path in paths:
            pixels = side.preprocess(Image.open(path))
            grid = side.grid(pixels)
            prompt = prompt_for(*grid)
            (run,) = side.placeholders(prompt, [grid])
            out.append((prompt, (ImageInput(tuple(run), content_hash(path.read_bytes()) + tag, pixels),)))
        return out

    return Family(folder, requests, chunk=9, max_len=128)


FAMILIES = {"llama4": _llama4, "mistral_small_4": _mistral_small_4}


def _answers(runner: ModelRunner, family: Family, tag: str = "") -> list[list[int]]:
    """Each picture's greedy tokens, one request after the other through a small engine."""
    engine = picture.small_engine(runner, load_model(family.folder).tokenizer, family.chunk, family.max_len)
    return [picture.greedy_request(engine, p, images, NEW_TOKENS)[0] for p, images in family.requests(tag)]


class ZeroPixelsForWorkers(ParallelRunner):
    """The planted bug: the workers get the step with every picture's pixels zeroed (rank 0 keeps
    them), as a driver that forgot to send them on would leave the workers' towers guessing."""

    def _worker_args(self, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if name not in ("execute_model", "compute_logits") or not args[1].image_slices:
            return args
        slices = [
            replace(s, image=replace(s.image, pixels=_zeros(s.image.pixels))) for s in args[1].image_slices
        ]
        return (args[0], replace(args[1], image_slices=slices))


def _zeros(pixels: Any) -> Any:
    return np.zeros_like(pixels)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("kind", list(FAMILIES))
def test_pictures_tp2_match_one_device(tmp_path: Path, kind: str) -> None:
    torch.set_num_threads(1)
    family = FAMILIES[kind](tmp_path)
    with exact_weights():
        one = TorchRunner(load_model(family.folder), EXACT)
    want = _answers(one, family)
    assert want[0] != want[1]  # the picture matters to the answer
    options = replace(EXACT, tensor_parallel_size=2)
    with exact_weights():
        runner = ParallelRunner(load_model(family.folder), options)
    try:
        assert runner.kv_cache_spec.num_kv_heads == one.kv_cache_spec.num_kv_heads // 2  # rank 0's half
        assert runner.runner.images is not None  # and a tower of its own
        assert _answers(runner, family) == want
    finally:
        runner.shutdown()
    with exact_weights():
        planted = ZeroPixelsForWorkers(load_model(family.folder), options)
    try:
        broken = _answers(planted, family, tag="-zeros")
    finally:
        planted.shutdown()
    assert broken != want
