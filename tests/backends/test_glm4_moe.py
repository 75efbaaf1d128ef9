"""GLM-4.5-style MoE (glm4_moe) against transformers (fp32), torch runner: q/k/v biases without an o bias,
RoPE on half of each head, the optional q/k norm, a dense first layer then DeepSeek-V3's sigmoid router
(selection bias, grouped top-k, scaled weights) with a shared expert; the checkpoint's multi-token-
prediction layer is dropped at load.

The parity suite's paged-cache checks run here on this module's own `pair` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import MODEL_ARCH, ExpertGatingFuncType, GGUFWriter, get_tensor_name_map

from localchat.arch.deepseek import RouterSpec
from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.backends.test_moe import hf_state
from tests.backends.test_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.parity import PROMPT, assert_close, hf_logits, tiny_tokenizer_json
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, _add_tensor, _write_hparams, _write_tokenizer
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

MOE: dict[str, Any] = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
}
VARIANTS: dict[str, dict[str, Any]] = {
    # GLM-4.5's options: biases, q/k norm, grouped routing (2 groups, 1 kept), scaled weights.
    "glm4_moe": {
        **MOE,
        "attention_bias": True,
        "use_qk_norm": True,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
    },
    # No q/k norm nor biases, raw top-k weights, a quarter of each head turning.
    "glm4_moe-plain": {**MOE, "norm_topk_prob": False, "partial_rotary_factor": 0.25},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_hf_model("glm4_moe", **VARIANTS[request.param])
    return hf, fp32_runner(bundle_from_hf(hf))


def test_config_reads_partial_rotary_and_router() -> None:
    d = tiny_hf_model("glm4_moe", **VARIANTS["glm4_moe"]).config.to_dict()
    config = ModelConfig.from_hf_dict(d)
    assert (config.head_dim, config.rotary_dim, config.attention_bias) == (16, 8, True)
    router = RouterSpec.from_config(config)
    assert (router.sigmoid, router.groups, router.groups_used, router.scale) == (True, 2, 1, 2.5)


def test_hub_folder_with_an_mtp_layer(tmp_path: Path) -> None:
    """save_pretrained's per-expert names and the selection bias buffer; a multi-token-prediction layer
    after the last one (GLM-4.5 ships one) is skipped rather than refused."""
    from safetensors.torch import load_file, save_file

    hf = tiny_hf_model("glm4_moe", **VARIANTS["glm4_moe"])
    hf.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in state
    state |= {k.replace("layers.1.", "layers.2."): v.clone() for k, v in state.items() if ".layers.1." in k}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    driver = PagedDriver(fp32_runner(load_model(tmp_path)))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT * 2))


def write_glm4_moe_gguf(path: Path, hf: torch.nn.Module) -> Path:
    """The model as llama.cpp's Glm4MoeModel converter writes it: tensor names from the gguf package's own
    glm4moe map, experts stacked, no q/k permutation, Q8_0 matrices, and one multi-token-prediction block
    counted in block_count (a copy of the last layer plus `nextn.*` tensors), as GLM-4.5 files carry."""
    cfg = hf.config.to_dict()
    layers = cfg["num_hidden_layers"]
    names = get_tensor_name_map(MODEL_ARCH.GLM4_MOE, layers + 1)
    writer = GGUFWriter(path, "glm4moe")
    _write_hparams(writer, {**cfg, "num_hidden_layers": layers + 1, "partial_rotary_factor": 0.5})
    writer.add_expert_count(cfg["n_routed_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    writer.add_expert_shared_count(cfg["n_shared_experts"])
    writer.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    writer.add_expert_weights_scale(cfg["routed_scaling_factor"])
    writer.add_expert_weights_norm(cfg["norm_topk_prob"])
    writer.add_nextn_predict_layers(1)
    _write_tokenizer(writer, cfg, "gpt2", "smollm", None, None, None)
    state = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    last = f"model.layers.{layers - 1}."
    state |= {k.replace(last, f"model.layers.{layers}."): v for k, v in state.items() if k.startswith(last)}
    for name, data in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H] -> gate and up stacks
            stem = name.removesuffix("gate_up_proj")
            gate, up = np.split(data, 2, axis=1)
            for part, stack in (("gate_proj", gate), ("up_proj", up)):
                _add_tensor(writer, str(names.get_name(f"{stem}{part}.weight", (".weight",))), stack, "Q8_0")
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if name.endswith("mlp.experts.down_proj"):
            gguf_name = names.get_name(name + ".weight", try_suffixes=(".weight",))
        assert gguf_name is not None, name
        _add_tensor(
            writer, gguf_name, np.ascontiguousarray(data), "F32" if "ffn_gate_inp" in gguf_name else "Q8_0"
        )
    hidden = cfg["hidden_size"]
    writer.add_tensor(f"blk.{layers}.nextn.eh_proj.weight", np.zeros((hidden, 2 * hidden), np.float32))
    writer.add_tensor(f"blk.{layers}.nextn.enorm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gguf_matches_transformers_on_dequantized_weights(tmp_path: Path, variant: str) -> None:
    # llama.cpp's converter writes half of each head turning (its default) and no expert groups.
    overrides = {"partial_rotary_factor": 0.5, "n_group": 1, "topk_group": 1, "vocab_size": TINY_VOCAB_SIZE}
    hf = tiny_hf_model("glm4_moe", **{**VARIANTS[variant], **overrides})
    bundle = load_model(write_glm4_moe_gguf(tmp_path / "glm.gguf", hf))
    c = bundle.config
    assert (c.model_type, c.num_hidden_layers, c.rotary_dim) == (
        "glm4_moe",
        2,
        8,
    )  # the MTP block is not a layer
    assert c.extra["use_qk_norm"] == VARIANTS[variant].get("use_qk_norm", False)
    weights = [w for w in bundle.iter_weights() if not w.name.startswith("model.layers.2.")]
    assert any(w.dtype == "Q8_0" for w in weights if ".experts." in w.name)
    state = {
        k.replace("e_score_correction.bias", "e_score_correction_bias"): v
        for k, v in hf_state(weights).items()
    }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and not missing
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT * 2))


@pytest.mark.mlx
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mlx_matches_transformers(variant: str) -> None:
    """The MLX model file: prompt logits and greedy decode steps."""
    pytest.importorskip("mlx.core")
    from localchat.backends.mlx.runner import MLXRunner

    hf = tiny_hf_model("glm4_moe", **VARIANTS[variant])
    runner = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    driver = PagedDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(torch.from_numpy(np.array(logits)).float(), hf_logits(hf, PROMPT * 2))
    for _ in range(4):
        driver.feed("a", int(np.array(logits[-1]).argmax()))
        _, logits = driver.step_logits()
        assert_close(torch.from_numpy(np.array(logits[0])).float(), hf_logits(hf, driver.tokens("a"))[-1])
