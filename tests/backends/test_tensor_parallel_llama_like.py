"""The Llama-like families under tensor parallelism: Llama's layer (and its sums) with each family's own
step around it, so the rank runs the family's code on its heads. SmolLM3 (NoPE layers: cos 1, sin 0 on
every head, and the window on those layers only), Ministral 3 (the per-token q temperature after RoPE,
tied embeddings, a sliding window), Qwen2-VL / Qwen3-VL / Qwen3-VL-MoE's text models (M-RoPE turns each
head's sections, DeepStack rows are added to the whole summed vector, the MoE's experts cut like
Qwen3-MoE's). Text: TP=2 (gloo, 2 processes) gives one device's greedy tokens and float32 logits
within 1e-4, ragged then decode and chunked with a preemption (tests/helpers/tp_parity.py).

Pictures: every rank runs its own copy of the vision tower on the step's pixels (docs/parallel.md says
why), so through LLMEngine with a prefill chunk boundary inside each picture's run a TP=2 runner gives
one device's greedy tokens: Qwen2-VL (M-RoPE positions), Qwen3-VL (DeepStack) and a LLaVA-style model
(family "llama")."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import ModelRunner
from localchat.engine.request import ImageInput
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.helpers import llava_models, qwen_vl_gguf
from tests.helpers import picture_parity as picture
from tests.helpers import qwen_vl_models as qwen_vl
from tests.helpers.torch_models import VARIANTS, bundle_from_hf, exact_weights, tiny_hf_model
from tests.helpers.tp_parity import TP2, assert_tp_parity

EXACT = RunnerOptions(device="cpu", dtype="float32", num_threads=1)
LLAVA_PROMPT = [1, 3, *[llava_models.IMAGE] * llava_models.TOKENS_PER_IMAGE, 5, 6, 7, 8, 4]


def smollm3_bundle() -> ModelBundle:
    """4 layers, the 4th NoPE and the only sliding one (window 8, shorter than the prompts)."""
    hf = tiny_hf_model("smollm3", num_hidden_layers=4, use_sliding_window=True, sliding_window=8)
    return bundle_from_hf(hf)


def ministral3_bundle() -> ModelBundle:
    """A strong temperature from position 8 on, tied embeddings, a sliding window of 8."""
    model_type, overrides = VARIANTS["ministral3-hot-tied"]
    return bundle_from_hf(tiny_hf_model(model_type, **overrides))


def _halves(local: Any) -> None:
    layer = local.model.layers[0]
    assert (layer.heads, layer.kv_heads) == (2, 1)  # 2 of 4 q heads, 1 of 2 KV heads


@pytest.mark.slow  # spawns gloo ranks
def test_smollm3_tp2_matches_one_device() -> None:
    def check(local: Any) -> None:
        _halves(local)
        layers = local.model.layers
        assert [layer.rope for layer in layers] == [True, True, True, False]
        windows = [None if layer.attn_options is None else layer.attn_options.window for layer in layers]
        assert windows == [None, None, None, 8]

    assert_tp_parity(smollm3_bundle, TP2, check)


@pytest.mark.slow  # spawns gloo ranks
def test_ministral3_tp2_matches_one_device() -> None:
    def check(local: Any) -> None:
        _halves(local)
        assert local.model.temperature is not None  # the q scale really runs

    assert_tp_parity(ministral3_bundle, TP2, check)


@pytest.fixture(scope="module")
def vl_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Qwen2-VL and Qwen3-VL folders (their towers included), and a Qwen3-VL-MoE text GGUF beside
    its mmproj (llama.cpp's converter: localchat reads that model from GGUF only)."""
    folders = {}
    for kind in ("qwen2_vl", "qwen3_vl"):
        folders[kind] = tmp_path_factory.mktemp(kind)
        qwen_vl.write_folder(kind, folders[kind])
    hf_folder = tmp_path_factory.mktemp("qwen3_vl_moe-hf")
    qwen_vl_gguf.write_folder("qwen3_vl_moe", hf_folder)
    text, _ = qwen_vl_gguf.write_gguf_pair(hf_folder, tmp_path_factory.mktemp("qwen3_vl_moe"))
    folders["qwen3_vl_moe"] = text
    return folders


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen3_vl", "qwen3_vl_moe"])
def test_qwen_vl_text_tp2_matches_one_device(vl_folders: dict[str, Path], kind: str) -> None:
    def check(local: Any) -> None:
        _halves(local)
        assert local.images is not None  # each rank keeps its own tower
        experts = getattr(local.model.layers[0], "moe", None)
        if experts is not None:  # every expert kept, half its width (48 -> 24)
            assert [tuple(e.down.shape) for e in experts.experts] == [(64, 24)] * 4

    assert_tp_parity(functools.partial(load_model, vl_folders[kind]), TP2, check)


def _rank0_heads(runner: ParallelRunner) -> tuple[int, int]:
    layer: Any = runner.runner.model.layers[0]
    return layer.heads, layer.kv_heads


def _tp2(bundle: ModelBundle) -> ParallelRunner:
    with exact_weights():
        return ParallelRunner(bundle, replace(EXACT, tensor_parallel_size=2))


def _one_device(bundle: ModelBundle) -> TorchRunner:
    with exact_weights():
        return TorchRunner(bundle, EXACT)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen3_vl"])
def test_qwen_vl_pictures_tp2_match_one_device(
    vl_folders: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    """Two pictures and a text request batched, prefilled in chunks of 7 (the boundary inside each
    picture's run): the workers get the pixels and the M-RoPE positions with every step."""
    from tests.backends.test_pipeline_images import answers

    torch.set_num_threads(1)
    folder, pictures = vl_folders[kind], qwen_vl.pictures(tmp_path)
    want = answers(_one_device(load_model(folder)), folder, pictures)
    runner = _tp2(load_model(folder))
    try:
        assert answers(runner, folder, pictures) == want and want[0] != want[1]
    finally:
        runner.shutdown()


def _llava_answers(runner: ModelRunner, folder: Path, pictures: list[Path]) -> list[list[int]]:
    """Each picture's greedy tokens through a small engine, prefilled in chunks of 7."""
    from localchat.vision.gemma3_preprocess import content_hash
    from localchat.vision.llava_prompt import LlavaImagePrompt
    from localchat.vision.model_info import vision_config

    config = vision_config(folder)
    assert config is not None
    prompt_side = LlavaImagePrompt.from_config(folder, config)
    (run,) = prompt_side.placeholders(LLAVA_PROMPT)
    engine = picture.small_engine(runner, load_model(folder).tokenizer, 7, 128)
    tokens = []
    for path in pictures:
        image = ImageInput(
            tuple(run), content_hash(path.read_bytes()), prompt_side.preprocess(Image.open(path))
        )
        tokens.append(picture.greedy_request(engine, LLAVA_PROMPT, [image], 6)[0])
    return tokens


@pytest.mark.slow  # spawns gloo ranks
def test_llava_pictures_tp2_match_one_device(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    folder = tmp_path / "llava"
    folder.mkdir()
    llava_models.write_folder(folder)
    pictures = llava_models.pictures(tmp_path)
    want = _llava_answers(_one_device(load_model(folder)), folder, pictures)
    runner = _tp2(load_model(folder))
    try:
        assert _rank0_heads(runner) == (2, 1)
        assert _llava_answers(runner, folder, pictures) == want and want[0] != want[1]
    finally:
        runner.shutdown()
