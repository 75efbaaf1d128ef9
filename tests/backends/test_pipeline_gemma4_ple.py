"""Gemma 4 E2B / E4B split into stages (#33): per-layer embeddings and K/V-sharing layers.

A later stage receives [hidden | scaled embeddings] and makes its own layers' per-layer inputs (its
columns of the per-layer table, its rows of the projection); the split's boundaries keep every
K/V-sharing layer with the layer whose keys and values it reads. A tiny random E2B-shaped model
([sliding, full] x 3, the last two layers reading layers 2 and 3's K/V, 8-wide per-layer inputs) gives
one device's float32 logits (1e-5) and greedy tokens under `--gpu-layers` (cpu/cpu) and `--pp 2`
(gloo), ragged, chunked and preempted, and with a picture (its rows take the pad token's per-layer
embeddings on the later stage too)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.device_split import SplitRunner, split_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.layer_split import split_layers, stage_runs
from localchat.backends.torch.parallel.pipeline import check_pipeline
from localchat.backends.torch.parallel.stages import StageRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from tests.backends.test_gemma4 import BASE, VARIANTS, tiny_gemma4
from tests.backends.test_pipeline_gemma import assert_same
from tests.backends.test_pipeline_parallel import PP2
from tests.helpers.torch_models import bundle_from_hf, exact_weights

SLIDING, FULL = "sliding_attention", "full_attention"
E2B_SHAPED: dict[str, Any] = {
    **BASE,
    "num_hidden_layers": 6,
    "layer_types": [SLIDING, FULL] * 3,
    "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": 256,
    "num_kv_shared_layers": 2,  # layer 4 reads layer 2's K/V, layer 5 layer 3's
}
EXACT = RunnerOptions(device="cpu", dtype="float32", num_threads=1)


def e2b_bundle() -> ModelBundle:
    """Also the PP workers' loader (the same seeded weights in every process)."""
    return bundle_from_hf(tiny_gemma4(**E2B_SHAPED))


def _config(layers: int, shared: int, pattern: int) -> ModelConfig:
    """A Gemma 4 config with the real models' layer layout (no weights): every `pattern`-th layer global."""
    types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]
    types[-1] = FULL
    extra = {"layer_types": types, "num_kv_shared_layers": shared}
    return ModelConfig("gemma4_text", 256, 64, 128, layers, 4, 1, 16, extra=extra)


def test_boundaries_keep_kv_sharing_layers_with_their_sources() -> None:
    """E2B's layout (35 layers, 4 sliding + 1 global, the last 20 reading layers 13 and 14's K/V):
    layers 13-34 share the last stage; the earlier stages split the rest as evenly as they can."""
    e2b = _config(35, 20, 5)
    assert stage_runs(e2b, 2, "--pp 2") == [range(0, 13), range(13, 35)]
    three = stage_runs(e2b, 3, "--pp 3")
    assert three[-1] == range(13, 35) and [len(r) for r in three[:2]] == [7, 6]
    with pytest.raises(
        BackendUnavailableError, match=r"layers 13-34 must share a stage .* at most 14 stages"
    ):
        stage_runs(e2b, 15, "--pipeline-parallel-size 15")
    plain = _config(35, 0, 5)  # no K/V sharing (the 31B): split_layers' balance
    assert stage_runs(plain, 4, "--pp 4") == split_layers(35, 4)


@pytest.mark.parametrize("gpu_layers", [4, 5])
def test_gpu_layers_split_matches_one_device(gpu_layers: int) -> None:
    """Stage 1 holds layers 2-5 (or 1-5): the sharing layers and their sources; each stage holds its own
    layers' 8 columns of the per-layer table and rows of the projection, and only the first the embedding
    it starts from (the last keeps it as the tied LM head)."""
    torch.set_num_threads(1)
    bundle = e2b_bundle()
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=gpu_layers)
    with exact_weights():
        runner = split_runner(bundle, options, devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    first, last = (cast(Any, stage.model) for stage in runner.stages)
    assert tuple(first.ple_embed.shape) == (256, 8 * (6 - gpu_layers))
    assert tuple(last.ple_embed.shape) == (256, 8 * gpu_layers)
    assert tuple(last.ple_projection.shape) == (8 * gpu_layers, 64)
    full = cast(Any, TorchRunner(bundle, EXACT).model)
    start = 8 * (6 - gpu_layers)
    torch.testing.assert_close(last.ple_embed, full.ple_embed[:, start:], rtol=0, atol=0)
    torch.testing.assert_close(last.ple_projection, full.ple_projection[start:], rtol=0, atol=0)
    assert_same(cast(TorchRunner, runner), bundle)


def test_a_split_through_kv_sharing_is_refused_with_the_counts_that_work() -> None:
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=2)
    message = r"--gpu-layers 2: Gemma 4 layer 4 reuses .* layer 2, .* --gpu-layers 0, 4-6\)"
    with pytest.raises(BackendUnavailableError, match=message):
        split_runner(e2b_bundle(), options, devices=("cpu", "cpu"))
    with pytest.raises(BackendUnavailableError, match=r"6-layer model splits into at most 3 stages"):
        check_pipeline(e2b_bundle().config, 4)
    unsplittable = bundle_from_hf(tiny_gemma4(**VARIANTS["gemma4-k-eq-v-shared"]))  # [0, 1, 0', 1']
    with pytest.raises(BackendUnavailableError, match="cannot be split: run it on one device"):
        check_pipeline(unsplittable.config, 2)


@pytest.mark.slow  # spawns a gloo rank: out of the fast tier, still in CI
def test_pp2_matches_one_device() -> None:
    torch.set_num_threads(1)
    bundle = e2b_bundle()
    with exact_weights():
        runner = ParallelRunner(bundle, PP2, load=functools.partial(e2b_bundle))
    try:
        assert len(cast(StageRunner, runner.runner).model.layers) == 2  # layers 0-1 | 2-5
        assert_same(cast(TorchRunner, runner), bundle)
    finally:
        runner.shutdown()


def test_a_picture_under_the_split_matches_one_device(tmp_path: Path) -> None:
    """A picture in the prompt: the first stage writes its rows, the later one gets them in the carried
    embeddings and reads the pad token's per-layer rows under them, as one device does."""
    from localchat.weights.loader import load_model
    from tests.backends.test_gemma4_vision import _picture_prompt
    from tests.helpers.gemma4_vision_models import TEXT_PLE, pictures, write_folder
    from tests.helpers.picture_prefill import prefill_logits
    from tests.helpers.torch_batch import PagedDriver

    torch.set_num_threads(1)
    folder = tmp_path / "model"
    write_folder(folder, TEXT_PLE)
    prompt, image = _picture_prompt(folder, pictures(tmp_path)[1])
    outputs = []
    for gpu_layers in (None, 2):
        options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=gpu_layers)
        with exact_weights():
            bundle = load_model(folder)
            split = gpu_layers is not None
            runner = split_runner(bundle, options, ("cpu", "cpu")) if split else TorchRunner(bundle, options)
        driver = PagedDriver(cast(TorchRunner, runner))
        driver.add("a", prompt)
        outputs.append(prefill_logits(cast(TorchRunner, runner), driver, "a", image, [(0, len(prompt))]))
    # float32 matmuls of the same widths: equal (a stage of one layer, 8 columns of the projection, takes
    # another BLAS kernel than the whole matrix and is ~1e-6 off; real models' slices are 256 wide).
    assert np.abs(outputs[0] - outputs[1]).max() < 1e-5
