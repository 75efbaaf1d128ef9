"""gpt-oss as llama.cpp writes it (arch `gpt-oss`): a tiny GptOssForCausalLM converted by llama.cpp's own
convert_hf_to_gguf.py loads on the torch backend and matches transformers (fp32 logits, greedy tokens).

Two files: one from float experts (the converter splits gate|up and their biases, transposes, and stores
them F32) and one from the hub's MXFP4 experts (repacked into GGML MXFP4 blocks). The file's chat
template is the folder's harmony one, so the server's harmony reader is chosen for it. The MXFP4 experts
stay in their blocks on localchat's CPU kernels and track the dequantized run, and the hub folder's
MXFP4 tensors repack at load into the very bytes the converter wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.arch import gpt_oss
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.bundle import ModelBundle
from localchat.weights.experts import split_experts
from localchat.weights.loader import load_model
from tests.backends.test_gpt_oss import TINY, _mxfp4_experts, tiny_gpt_oss
from tests.helpers.gpt_oss_gguf import VOCAB_SIZE, convert_gpt_oss, save_folder
from tests.helpers.parity import GREEDY, assert_close, hf_generate, hf_logits
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow  # runs llama.cpp's converter (downloads llama-cpp-python's sdist once)

PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64, 260]


def tiny_model(seed: int = 0) -> torch.nn.Module:
    old = TINY["vocab_size"]
    TINY["vocab_size"] = VOCAB_SIZE  # room for the harmony special tokens
    try:
        return tiny_gpt_oss(seed)
    finally:
        TINY["vocab_size"] = old


def mxfp4_model(hf: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The hub's checkpoint form of `hf` with random MXFP4 experts; `hf` takes their dequantized values."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    parts = _mxfp4_experts(hf)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if f"{name}_blocks" in parts:
                blocks, scales = parts[f"{name}_blocks"], parts[f"{name}_scales"]
                param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    return {k: v for k, v in hf.state_dict().items() if f"{k}_blocks" not in parts} | parts


@pytest.fixture(scope="module")
def float_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    tmp = tmp_path_factory.mktemp("gpt-oss-f32")
    hf = tiny_model()
    return hf, convert_gpt_oss(save_folder(hf, tmp / "hf"), tmp / "tiny-f32.gguf")


@pytest.fixture(scope="module")
def mxfp4_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    tmp = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    hf = tiny_model(seed=3)
    state = mxfp4_model(hf)
    return hf, convert_gpt_oss(save_folder(hf, tmp / "hf", state), tmp / "tiny-mxfp4.gguf")


def _check_against(hf: torch.nn.Module, runner: TorchRunner) -> None:
    """Prompt logits at every position, then 10 greedy tokens, as transformers computes them."""
    prompt = PROMPT * 2  # 24 tokens: well past the 4-token window of the even layers
    driver = PagedDriver(runner)
    driver.add("a", prompt)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    expected = hf_generate(hf, prompt, 10)
    driver = PagedDriver(runner)
    driver.add("g", prompt, GREEDY)
    for _ in range(10):
        driver.step()
    assert driver.tokens("g")[len(prompt) :] == expected


def test_config_from_gguf(float_file: tuple[torch.nn.Module, Path]) -> None:
    config = load_model(float_file[1]).config
    assert config.model_type == "gpt_oss"
    assert config.sliding_window == 4
    assert config.extra["layer_types"] == ["sliding_attention", "full_attention"]  # llama.cpp: even slide
    assert (config.extra["num_local_experts"], config.extra["num_experts_per_tok"]) == (6, 4)
    assert config.attention_bias and config.head_dim == 16 and config.intermediate_size == 32
    scaling = config.rope_scaling or {}
    assert (scaling["rope_type"], scaling["factor"], scaling["truncate"]) == ("yarn", 4.0, False)
    assert scaling["original_max_position_embeddings"] == 128


def test_float_gguf_matches_transformers(float_file: tuple[torch.nn.Module, Path]) -> None:
    hf, path = float_file
    _check_against(hf, fp32_runner(load_model(path)))


def test_mxfp4_gguf_matches_transformers(mxfp4_file: tuple[torch.nn.Module, Path]) -> None:
    hf, path = mxfp4_file
    bundle = load_model(path)
    types = {w.name.split(".")[-2]: w.dtype for w in bundle.iter_weights() if w.name.endswith(".weight")}
    assert types["gate_proj"] == types["up_proj"] == types["down_proj"] == "MXFP4"
    _check_against(hf, fp32_runner(bundle))


def test_chat_template_is_harmony(float_file: tuple[torch.nn.Module, Path]) -> None:
    from localchat.serving.tool_parsers import pick_parser

    bundle: ModelBundle = load_model(float_file[1])
    template = bundle.chat_template or ""
    assert "<|channel|>" in template
    assert pick_parser(template_source=template).name == "harmony"


def test_hub_blocks_repack_to_the_bytes_llama_cpp_writes(mxfp4_file: tuple[torch.nn.Module, Path]) -> None:
    """The safetensors folder's MXFP4 experts, repacked at load (arch/gpt_oss.py), are byte for byte the
    blocks llama.cpp's converter stored in the GGUF (gate and up rows de-interleaved alike)."""
    _, path = mxfp4_file
    from_hub = {w.name: w for w in load_model(path.parent / "hf").iter_weights()}
    sanitized = {w.name: w for w in gpt_oss.sanitize(load_model(path).config, from_hub.values())}
    gguf = {w.name: w for w in split_experts(load_model(path).iter_weights())}
    for layer in range(2):
        for e in range(6):
            ours = sanitized[f"model.layers.{layer}.mlp.experts.{e}.gate_up.weight"]
            gate, up = (gguf[f"model.layers.{layer}.mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up"))
            assert ours.dtype == gate.dtype == "MXFP4"
            assert np.array_equal(ours.data, np.concatenate([gate.data, up.data]))
            down = sanitized[f"model.layers.{layer}.mlp.experts.{e}.down.weight"]
            assert np.array_equal(
                down.data, gguf[f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight"].data
            )


@pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")
def test_mxfp4_gguf_experts_stay_compact(
    mxfp4_file: tuple[torch.nn.Module, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.backends.test_kernels_mxfp4 import assert_tracks, compact_and_dequantized, expert_matrices

    compact, exact = compact_and_dequantized(mxfp4_file[1], monkeypatch)
    mats = expert_matrices(compact)
    assert all(isinstance(m, kernels.BlockMatrix) for m in mats)
    assert {s.qtype for m in mats for s in m.segments} == {"MXFP4"}
    assert_tracks(compact, exact, PROMPT * 2)


@pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")
def test_ram_estimate_counts_mxfp4_experts_as_stored(
    mxfp4_file: tuple[torch.nn.Module, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernels the pre-load RAM check sizes MXFP4 experts at 17 bytes per 32 weights (the rest
    of this file is F32 and stays so in bfloat16's estimate), not expanded to 2 bytes a weight."""
    from gguf import GGMLQuantizationType

    from localchat.models.memory import compact_gguf_types, estimate
    from localchat.weights.gguf import open_gguf

    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    path = mxfp4_file[1]
    tensors = open_gguf(path).tensors
    mxfp4 = [t for t in tensors if t.tensor_type == GGMLQuantizationType.MXFP4]
    assert mxfp4 and "MXFP4" in compact_gguf_types("bfloat16")
    assert estimate(path, 64, dtype="bfloat16").weights == sum(int(t.n_bytes) for t in tensors)
    assert sum(int(t.n_bytes) for t in mxfp4) * 32 == sum(int(t.n_elements) for t in mxfp4) * 17
