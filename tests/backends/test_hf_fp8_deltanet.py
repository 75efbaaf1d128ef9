"""Issue #34: Qwen3.5's and Qwen3-Next's gated DeltaNet projections in FP8 folders stay compact. Qwen's
FP8 repos quantize in_proj_qkv / in_proj_z / out_proj (Qwen3-Next: the grouped in_proj_qkvz) in 128 x 128
blocks and keep in_proj_b / in_proj_a (Qwen3-Next: in_proj_ba) in bf16: one row per value head, no 128-row
block. Before, the DeltaNet linears were not among hf_quant's compact names, and the torch loader fuses
qkv | z | b | a into one in_proj that is dense as soon as one part is: all of it was dequantized. Now the
FP8 rows become Q8_0, the bf16 b / a rows Q8_0 on their amax / 127 grid (weights/hf_q8_blocks.py
`dense_q8`; the exact values where a backend dequantizes), Qwen3-Next's split keeps the blocks
(`take_rows`), and in_proj / out run on localchat's CPU kernels: greedy tokens of the exact fp8 run,
logits within Q8_DELTANET_ATOL; the exact run follows transformers holding the same values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models

from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.hf_quant import loaded_weight_bytes
from localchat.weights.loader import load_model
from localchat.weights.safetensors import safetensors_files
from tests.backends.test_hf_fp8_compact import fp8_block_parts
from tests.backends.test_hf_quant_compact import compact_runner
from tests.backends.test_qwen3_next import PROMPT, TINY
from tests.backends.test_qwen3_next_moe import FAMILIES, MOE
from tests.helpers.hybrid_parity import HybridDriver, reference_logits
from tests.helpers.parity import as_numpy
from tests.helpers.quant_folders import Quantizer, hold_values, quantize_tensors, save_quantized
from tests.helpers.torch_models import fp32_runner

# Whole 32-value blocks everywhere: hidden 128, heads and DeltaNet heads of 32
WIDE = {"hidden_size": 128, "intermediate_size": 256, "head_dim": 32}
WIDE |= {"linear_key_head_dim": 32, "linear_value_head_dim": 32}
FP8_NAMES = ("_proj.weight", "in_proj_qkv.weight", "in_proj_z.weight", "in_proj_qkvz.weight")
BF16_NAMES = ("in_proj_b.weight", "in_proj_a.weight", "in_proj_ba.weight")
# transformers' float32 against the dequantized float32 path (test_qwen3_next.py's TOL)
HF_ATOL = 3e-3
DECODE_STEPS = 6
VARIANTS = ("qwen3_5", "qwen3_next")
# Weights 0.05 x normal: at 0.25 (test_qwen3_next's) these recurrent tiny models are chaotic (FP8's own
# rounding moves logits by 7-12; at 0.1 a Qwen3-Next expert choice flips on Q8_0's rounding). At 0.05 FP8
# moves the logits (~2.3) by 0.30 / 0.93 from the float weights; Q8_0 adds 0.043 / 0.027 (the bf16 b / a
# rows' Q8_0 alone: 0.001 / 0.0003), the kernels ~1e-3 on top.
SCALE = 0.05
Q8_DELTANET_ATOL = 0.1


def tiny_hybrid(variant: str) -> Any:
    """test_qwen3_next's tiny Qwen3.5 (dense MLP) or test_qwen3_next_moe's Qwen3-Next (grouped qkvz / ba,
    experts), widened to whole blocks; weights SCALE x normal."""
    if variant == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        cls, config = Qwen3_5ForCausalLM, Qwen3_5TextConfig(**{**TINY, **WIDE})
    else:
        cls, config_cls, extra = FAMILIES["qwen3_next"]
        config = config_cls(**{**TINY, **WIDE, **MOE, **extra, "shared_expert_intermediate_size": 64})
    torch.manual_seed(0)
    model = cls(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not (name.endswith("A_log") or name.endswith("dt_bias")):
                param.copy_(SCALE * torch.randn_like(param))
    return model


def _as_bf16(w: np.ndarray) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    stored = torch.from_numpy(w).to(torch.bfloat16).contiguous()
    return {"weight": stored}, stored.float().numpy()


def _fp8_or_bf16(name: str, param: torch.Tensor) -> Quantizer | None:
    """Which layer matrices Qwen's FP8 repos keep in bf16 and which they quantize."""
    if ".layers." not in name or param.dim() != 2:
        return None
    if name.endswith(BF16_NAMES):
        return _as_bf16
    return (lambda w: fp8_block_parts(w, 128)) if name.endswith(FP8_NAMES) else None


def write_fp8_hybrid(tmp: Path, variant: str) -> Any:
    """The tiny model as Qwen's FP8 repos store it: layer linears (DeltaNet's qkv / z / qkvz / out, the
    attention, the MLP and shared expert) e4m3 + `weight_scale_inv` per 128 x 128 tile, DeltaNet's b / a in
    bf16, the rest as is; returns the transformers model holding those exact values."""
    hf = tiny_hybrid(variant)
    hf.save_pretrained(tmp)
    state, exact = quantize_tensors(hf.state_dict().items(), _fp8_or_bf16)
    qconfig = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    vocab = {f"t{i}": i for i in range(256)}
    save_quantized(tmp, state, qconfig, Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    hold_values(hf, exact)
    return hf


def generate(runner: Any) -> tuple[np.ndarray, list[int]]:
    """The prompt's logits (every position), then greedy decode steps' logits and tokens."""
    runner.initialize_state_cache(2)
    driver = HybridDriver(runner)
    driver.add("a", PROMPT)
    logits = as_numpy(driver.step_logits(every_token=True)[1])
    rows, tokens = [logits], []
    for _ in range(DECODE_STEPS):
        tokens.append(int(logits[-1].argmax()))
        driver.feed("a", tokens[-1])
        logits = as_numpy(driver.step_logits()[1])
        rows.append(logits)
    return np.concatenate(rows), tokens


def deltanet_parts(folder: Path) -> dict[str, Any]:
    return {w.name: w for w in load_model(folder).iter_weights() if ".linear_attn." in w.name}


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_deltanet_projections_are_handed_over_compact(tmp_path: Path, variant: str) -> None:
    hf = write_fp8_hybrid(tmp_path, variant)
    parts = deltanet_parts(tmp_path)
    compact = sorted(n.split("linear_attn.")[1] for n, w in parts.items() if isinstance(w, Q8Linear))
    layers = sum(t == "linear_attention" for t in hf.config.layer_types)
    names = ["in_proj_a", "in_proj_b", "in_proj_qkv", "in_proj_z", "out_proj"]
    if variant == "qwen3_next":  # grouped on disk; the family's sanitize splits them (in the backends)
        names = ["in_proj_ba", "in_proj_qkvz", "out_proj"]
    names = [f"{n}.weight" for n in names]
    assert compact == sorted(names * layers)
    logits, _ = generate(fp32_runner(load_model(tmp_path)))  # the exact (dequantized) values
    assert np.abs(logits[: len(PROMPT)] - reference_logits(hf, PROMPT)).max() < HF_ATOL


@pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")
@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_deltanet_runs_on_the_kernels(
    tmp_path: Path, variant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_fp8_hybrid(tmp_path, variant)
    compact = compact_runner(tmp_path, monkeypatch)
    linear_layers = [layer for layer in compact.model.layers if layer.linear]
    assert linear_layers
    for layer in linear_layers:
        for weight in (layer.in_proj, layer.out):
            assert isinstance(weight, BlockMatrix)
            assert {s.qtype for s in weight.segments} == {"Q8_0"}
    exact_logits, exact_tokens = generate(fp32_runner(load_model(tmp_path)))
    got_logits, got_tokens = generate(compact)
    diff = float(np.abs(got_logits - exact_logits).max())
    with capsys.disabled():
        print(
            f"\nFP8 {variant}: DeltaNet in_proj / out Q8_0 on the kernels; max |logit diff| vs exact {diff:.3f}"
        )
    assert got_tokens == exact_tokens
    assert diff < Q8_DELTANET_ATOL


def test_ram_estimate_counts_the_deltanet_projections_as_blocks(tmp_path: Path) -> None:
    """FP8 linears (DeltaNet's included) and the bf16 b / a rows at Q8_0's 34 bytes per 32 values."""
    write_fp8_hybrid(tmp_path, "qwen3_5")
    headers = [f.header for f in safetensors_files(tmp_path, True)]
    fp8 = sum(int(np.prod(i["shape"])) for h in headers for i in h.values() if i["dtype"] == "F8_E4M3")
    gates = sum(int(np.prod(i["shape"])) for h in headers for n, i in h.items() if n.endswith(BF16_NAMES))
    assert gates > 0
    saved = loaded_weight_bytes(headers, 2) - loaded_weight_bytes(headers, 2, compact=True)
    assert saved == (fp8 + gates) * 2 - (fp8 + gates) * 34 // 32
