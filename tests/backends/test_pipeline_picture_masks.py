"""A tiny random Gemma 3 with a picture, split into stages (#29/#33): every stage attends over the picture's
tokens both ways (later stages get its placeholder runs with the step, not its pixels), and the split
runner tells the engine to keep pictures whole, so a prefill chunk of 5 never cuts the run [3, 7). The
greedy tokens and their logprobs equal one device's (and transformers' tokens) under `--gpu-layers`
(cpu/cpu) and `--pp 2` (gloo)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.device_split import SplitRunner, split_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import ModelRunner
from localchat.engine.request import ImageInput
from localchat.engine.sampling_params import SamplingParams
from localchat.vision.gemma3_preprocess import ImageSpec, content_hash, decode, preprocess
from localchat.weights.loader import load_model
from tests.backends.test_gemma3_images_engine import PROMPT, _hf_greedy
from tests.backends.test_gemma3_vision import _pictures, saved  # noqa: F401 (fixture)
from tests.helpers.torch_models import exact_weights

EXACT = RunnerOptions(device="cpu", dtype="float32", num_threads=1)
NEW = 5


def _picture(folder: Path, tmp_path: Path) -> tuple[ImageInput, np.ndarray]:
    data = _pictures(tmp_path)[0]
    pixels = preprocess(decode(data), ImageSpec.from_folder(folder, 56))
    return ImageInput((3, 4, 5, 6), content_hash(data), pixels), pixels


def _answer(runner: ModelRunner, folder: Path, image: ImageInput) -> tuple[list[int], list[float], LLMEngine]:
    """Greedy tokens and their logprobs, prefilled in chunks of 5 (which would end inside the picture)."""
    bundle = load_model(folder)
    config = EngineConfig(kv_cache_mib=4, block_size=4, prefill_chunk_size=5)
    engine = LLMEngine(runner, bundle.tokenizer, config, eos_token_ids=[], model_max_len=64)
    params = SamplingParams(max_tokens=NEW, temperature=0.0, logprobs=0)
    engine.add_request(list(PROMPT), params, images=(image,))
    tokens: list[int] = []
    logprobs: list[float] = []
    while engine.has_unfinished:
        for out in engine.step():
            tokens += out.new_token_ids
            logprobs += [lp.logprob for lp in out.logprobs]
    return tokens, logprobs, engine


def _one_device(folder: Path, image: ImageInput) -> tuple[list[int], list[float]]:
    from localchat.backends.torch.runner import TorchRunner

    with exact_weights():
        runner = TorchRunner(load_model(folder), EXACT)
    tokens, logprobs, _ = _answer(runner, folder, image)
    return tokens, logprobs


def _assert_same(got: tuple[list[int], list[float]], want: tuple[list[int], list[float]]) -> None:
    assert got[0] == want[0]
    assert np.abs(np.array(got[1]) - np.array(want[1])).max() < 1e-4


def test_gpu_layers_split_attends_over_the_picture_both_ways(
    saved: tuple[torch.nn.Module, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    torch.set_num_threads(1)
    hf, folder = saved
    image, pixels = _picture(folder, tmp_path)
    want = _one_device(folder, image)
    assert want[0] == _hf_greedy(hf, pixels)
    bundle = load_model(folder)
    with exact_weights():
        runner = split_runner(bundle, replace(EXACT, gpu_layers=3), devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    tokens, logprobs, engine = _answer(runner, folder, image)
    _assert_same((tokens, logprobs), want)
    assert runner.stages[1].images is None  # the last stage's masks come from the runs alone
    assert engine.scheduler.whole_pictures  # the split runner keeps the picture in one chunk


def test_pp2_attends_over_the_picture_both_ways(
    saved: tuple[torch.nn.Module, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Rank 1 gets the picture's placeholder runs with the step (for its masks), never its pixels."""
    torch.set_num_threads(1)
    _, folder = saved
    image, _ = _picture(folder, tmp_path)
    want = _one_device(folder, image)
    with exact_weights():
        runner: Any = ParallelRunner(load_model(folder), replace(EXACT, pipeline_parallel_size=2))
    sent: list[Any] = []
    send = runner._send

    def recorded(name: str, args: tuple[Any, ...]) -> None:
        sent.append(args[1] if name == "execute_model" else None)
        send(name, args)

    runner._send = recorded
    try:
        tokens, logprobs, engine = _answer(runner, folder, image)
        assert engine.scheduler.whole_pictures
        _assert_same((tokens, logprobs), want)
        slices = [s for batch in sent if batch is not None for s in batch.image_slices]
        assert slices and all(s.image.pixels is None and s.image.placeholders == (3, 4, 5, 6) for s in slices)
    finally:
        runner.shutdown()
