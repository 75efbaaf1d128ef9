"""Steps that carry pictures, split into pipeline stages: the first stage runs the vision tower and writes
the image embeddings over the placeholder rows; every stage turns its layers' rotary by the step's
M-RoPE positions (they travel with the step). Through LLMEngine, with a prefill chunk boundary inside
the picture's run: the same greedy tokens as one device, for a tiny random Qwen2-VL (and the hybrid
Qwen3.5, whose DeltaNet state is per stage too) under `--gpu-layers` (cpu/cpu) and `--pp 2` (gloo)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.device_split import SplitRunner, split_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.pipeline import check_pipeline
from localchat.engine.interface import ModelRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.loader import load_model
from tests.helpers import qwen_vl_models as tiny
from tests.helpers.torch_models import exact_weights

EXACT = RunnerOptions(device="cpu", dtype="float32", num_threads=1)


def answers(runner: ModelRunner, folder: Path, pictures: list[Path]) -> list[list[int]]:
    """Greedy tokens for a prompt around each picture, prefilled in chunks of 7 (the image's run starts
    at 4: the boundary falls inside it), then a text-only follow-up in the same batch."""
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams
    from localchat.vision.gemma3_preprocess import content_hash
    from localchat.vision.qwen_vl_prompt import QwenImagePrompt

    prompt_side = QwenImagePrompt.from_config(folder, json.loads((folder / "config.json").read_text()))
    bundle = load_model(folder)
    config = EngineConfig(kv_cache_mib=4, block_size=4, prefill_chunk_size=7, max_num_seqs=4)
    engine = LLMEngine(runner, bundle.tokenizer, config, eos_token_ids=[], model_max_len=128)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    requests = []
    for path in pictures:
        pixels, grid = prompt_side.preprocess(Image.open(path))
        prompt = [1, 3, 5, tiny.START, *[tiny.IMAGE] * (grid[0] * grid[1] * grid[2]), tiny.END, 7, 9, 2, 1, 4]
        image = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, grid)])
        requests.append(engine.add_request(prompt, params, images=image))
    requests.append(engine.add_request([1, 3, 5, 7, 9, 2, 1, 4], params))
    tokens: dict[str, list[int]] = {r: [] for r in requests}
    while engine.has_unfinished:
        for out in engine.step():
            tokens[out.req_id] += out.new_token_ids
    return [tokens[r] for r in requests]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_5"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp(request.param)
    tiny.write_folder(request.param, folder)
    return request.param, folder


def one_device(folder: Path, pictures: list[Path]) -> list[list[int]]:
    with exact_weights():
        from localchat.backends.torch.runner import TorchRunner

        return answers(TorchRunner(load_model(folder), EXACT), folder, pictures)


def test_gpu_layers_split_with_pictures_matches_one_device(saved: tuple[str, Path], tmp_path: Path) -> None:
    torch.set_num_threads(1)
    _, folder = saved
    pictures = tiny.pictures(tmp_path)
    want = one_device(folder, pictures)
    bundle = load_model(folder)
    layers = bundle.config.num_hidden_layers
    with exact_weights():
        runner = split_runner(bundle, replace(EXACT, gpu_layers=layers // 2), devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    first, last = runner.stages
    assert first.images is not None and last.images is None  # the tower lives on the first stage
    got = answers(runner, folder, pictures)
    assert got == want and got[0] != got[1]  # the two pictures lead to different answers


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp2_with_pictures_matches_one_device(saved: tuple[str, Path], tmp_path: Path) -> None:
    """Rank 1 gets the hidden states with the picture's rows in them and the M-RoPE positions; the
    pixels stay on rank 0."""
    kind, folder = saved
    if kind != "qwen2_vl":
        pytest.skip("one gloo run is enough: the split test covers the hybrid")
    torch.set_num_threads(1)
    pictures = tiny.pictures(tmp_path)
    want = one_device(folder, pictures)
    with exact_weights():
        runner: Any = ParallelRunner(load_model(folder), replace(EXACT, pipeline_parallel_size=2))
    sent: list[Any] = []
    send = runner._send

    def recorded(name: str, args: tuple[Any, ...]) -> None:
        sent.append(args[1] if name == "execute_model" else None)
        send(name, args)

    runner._send = recorded
    try:
        assert answers(runner, folder, pictures) == want
        steps = [batch for batch in sent if batch is not None]
        slices = [s for batch in steps for s in batch.image_slices]
        assert slices and all(s.image.pixels is None for s in slices)  # no pixels sent to rank 1
        assert any(batch.rope_positions is not None for batch in steps)  # the 3-D positions are
    finally:
        runner.shutdown()


def test_deepstack_layers_must_sit_on_the_first_stage(tmp_path: Path) -> None:
    """Qwen3-VL (tiny: DeepStack rows after layers 0 and 1, 3 layers): 2 stages put 2 on the first,
    3 stages only 1, which cannot add the second row."""
    tiny.write_folder("qwen3_vl", tmp_path)
    bundle = load_model(tmp_path)
    check_pipeline(bundle.config, 2, bundle.path)
    with pytest.raises(BackendUnavailableError, match="DeepStack are added after each of its first 2 layers"):
        check_pipeline(bundle.config, 3, bundle.path)


def test_micro_batches_of_steps_with_pictures_match_one_device(tmp_path: Path) -> None:
    """The cut PP makes of a large step (micro_batches.py), run on one device: each group keeps its
    own pictures (token rows rebased) and M-RoPE columns; the tokens are the uncut runner's."""
    from localchat.backends.torch.parallel.micro_batches import micro_batches
    from localchat.backends.torch.runner import TorchRunner
    from localchat.engine.interface import BatchInputs

    class CutRunner(TorchRunner):
        cuts = 0

        def _logits(self, batch: BatchInputs) -> torch.Tensor:
            parts = micro_batches(batch, 3, min_tokens=1)
            self.cuts += sum(1 for p in parts if p.image_slices) if len(parts) > 1 else 0
            return torch.cat([super(CutRunner, self)._logits(part) for part in parts])

    torch.set_num_threads(1)
    folder = tmp_path / "qwen2_vl"
    folder.mkdir()
    tiny.write_folder("qwen2_vl", folder)
    pictures = tiny.pictures(tmp_path)
    want = one_device(folder, pictures)
    with exact_weights():
        runner = CutRunner(load_model(folder), EXACT)
    assert answers(runner, folder, pictures) == want
    assert runner.cuts >= 2  # steps were cut with pictures in more than one group
