"""gpt-oss (gpt_oss) against transformers' GptOssForCausalLM (fp32), torch runner: attention sinks on the
prefill and decode paths, a 4-token sliding window on even layers, YaRN rope (truncate off), q/k/v/o
biases, a biased top-k router (softmax over the chosen logits) and clamped SwiGLU experts with biases
stored stacked, transposed and interleaved.

The parity suite's paged-cache checks run here on this module's own `pair` fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssConfig

from localchat.backends.torch.runner import TorchRunner
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.backends.test_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_mixed_prefill_and_decode,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.parity import PROMPT, assert_close, hf_logits, tiny_tokenizer_json
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "num_local_experts": 6,
    "num_experts_per_tok": 4,
    "sliding_window": 4,
    "max_position_embeddings": 512,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 128,  # x factor = max_position_embeddings
    },
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def tiny_gpt_oss(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = GptOssConfig(**TINY)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("sinks"):
                param.copy_(2.0 * torch.randn_like(param))  # large enough to take real probability mass
            else:
                param.copy_(0.15 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_gpt_oss()
    return hf, fp32_runner(bundle_from_hf(hf))


def test_config_reads_windows_and_experts() -> None:
    config = ModelConfig.from_hf_dict(tiny_gpt_oss().config.to_dict())
    assert config.sliding_window == 4
    assert config.extra["layer_types"] == ["sliding_attention", "full_attention"]
    assert (config.extra["num_local_experts"], config.extra["num_experts_per_tok"]) == (6, 4)


def _mxfp4_experts(hf: torch.nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random MXFP4 codes and scales for every expert matrix, in the hub's names and shapes
    (blocks [E, out, in / 32, 16], scales [E, out, in / 32])."""
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, param in hf.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts, cols, rows = param.shape  # transformers keeps them [E, in, out]
            groups = cols // 32
            out[f"{name}_blocks"] = torch.randint(
                0, 256, (experts, rows, groups, 16), generator=generator
            ).to(torch.uint8)
            out[f"{name}_scales"] = torch.randint(120, 125, (experts, rows, groups), generator=generator).to(
                torch.uint8
            )
    return out


def test_mxfp4_dequantization_equals_transformers() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from localchat.weights.mxfp4 import dequantize_mxfp4

    parts = _mxfp4_experts(tiny_gpt_oss())
    blocks, scales = (
        parts["model.layers.0.mlp.experts.down_proj_blocks"],
        parts["model.layers.0.mlp.experts.down_proj_scales"],
    )
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    ours = torch.from_numpy(dequantize_mxfp4(blocks.numpy(), scales.numpy()))  # [E, out, in]
    assert torch.equal(ours.transpose(1, 2), ref)


def test_hub_folder_with_mxfp4_experts(tmp_path: Path) -> None:
    """The hub's form: expert matrices as MXFP4 blocks + e8m0 scales, the rest bf16; dequantized at load
    and compared with transformers running the same experts dequantized by its own converter."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf = tiny_gpt_oss()
    parts = _mxfp4_experts(hf)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if f"{name}_blocks" in parts:
                param.copy_(
                    convert_moe_packed_tensors(
                        parts[f"{name}_blocks"], parts[f"{name}_scales"], dtype=torch.float32
                    )
                )
    state = {k: v for k, v in hf.state_dict().items() if f"{k}_blocks" not in parts} | parts
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(tmp_path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = hf.config.to_dict() | {"quantization_config": {"quant_method": "mxfp4"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    driver = PagedDriver(fp32_runner(load_model(tmp_path)))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT * 2))
