"""Mixture-of-experts models (qwen3_moe, mixtral) beyond the parity suite's VARIANTS: GGUF files with
llama.cpp's stacked expert tensors (kept quantized), the hub's per-expert safetensors names, and the
pieces that map them (expert split, registry names, GGUF arch hook) on both backends."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.arch.moe import MoeSpec
from localchat.arch.registry import architecture
from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import ModelLoadError
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.experts import split_experts
from localchat.weights.loader import load_model
from localchat.weights.tensors import WeightTensor
from tests.helpers.parity import tiny_tokenizer_json
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import TINY_MOE, fp32_runner, tiny_hf_model

ATOL = 1e-4
PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]
BACKENDS = ["torch", pytest.param("mlx", marks=pytest.mark.mlx)]
# Every layer sparse: llama.cpp's qwen3moe has no dense layers.
ARCHS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {**TINY_MOE, "num_experts": 4, "norm_topk_prob": True},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}


def runner_for(backend: str, bundle: ModelBundle, dtype: str = "float32") -> Any:
    if backend == "torch":
        return fp32_runner(bundle) if dtype == "float32" else TorchRunner(bundle, RunnerOptions("cpu", dtype))
    pytest.importorskip("mlx.core")
    from localchat.backends.mlx.runner import MLXRunner

    return MLXRunner(bundle, RunnerOptions(device="cpu", dtype=dtype, seed=0))


def prompt_logits(runner: Any, prompt: list[int]) -> np.ndarray:
    driver = PagedDriver(runner)
    driver.add("a", prompt)
    _, logits = driver.step_logits(every_token=True)
    return logits.float().numpy() if isinstance(logits, torch.Tensor) else np.array(logits, dtype=np.float32)


def hf_logits(hf: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float().numpy()


def hf_state(weights: list[WeightTensor]) -> dict[str, torch.Tensor]:
    """transformers 5's state dict from a GGUF bundle's (dequantized) weights: experts restacked."""
    state: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for w in weights:
        tensor = torch.from_numpy(np.array(w.dequantize()))
        stacked = re.fullmatch(
            r"(model\.layers\.\d+\.)(?:mlp|block_sparse_moe)\.experts\.(\w+)\.weight", w.name
        )
        if stacked:
            stacks[stacked[1]][stacked[2]] = tensor
        else:
            state[w.name.replace("block_sparse_moe.gate", "mlp.gate")] = tensor
    for prefix, parts in stacks.items():
        gate, up = parts.get("gate_proj", parts.get("w1")), parts.get("up_proj", parts.get("w3"))
        assert gate is not None and up is not None
        state[f"{prefix}mlp.experts.gate_up_proj"] = torch.cat((gate, up), dim=1)
        state[f"{prefix}mlp.experts.down_proj"] = parts.get("down_proj", parts.get("w2"))  # type: ignore[assignment]
    return state


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("model_type", "qtype"), [("qwen3_moe", "Q8_0"), ("mixtral", "Q4_0")])
def test_gguf_experts_match_transformers_on_dequantized_weights(
    tmp_path: Path, backend: str, model_type: str, qtype: str
) -> None:
    hf = tiny_hf_model(model_type, vocab_size=TINY_VOCAB_SIZE, **ARCHS[model_type])
    path = write_tiny_gguf(tmp_path / "moe.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    bundle = load_model(path)
    assert bundle.config.model_type == model_type  # Mixtral: a "llama" file with experts
    weights = list(bundle.iter_weights())
    exps = [w for w in weights if ".experts." in w.name]
    assert exps and all(w.dtype == qtype and len(w.shape) == 3 for w in exps)
    missing, unexpected = hf.load_state_dict(hf_state(weights), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    runner = runner_for(backend, bundle)
    prompt = PROMPT * 2
    logits = prompt_logits(runner, prompt)
    assert np.abs(logits - hf_logits(hf, prompt)).max() < ATOL
    if backend == "mlx":  # the experts stay in MLX's quantized form, stacked for gather_qmm
        from localchat.backends.mlx.quant import QuantizedWeight

        moe = runner.model.layers[0].moe
        bits = 8 if qtype == "Q8_0" else 4
        assert isinstance(moe.gate_up, QuantizedWeight) and moe.gate_up.bits == bits
        assert isinstance(moe.down, QuantizedWeight) and moe.down.packed.shape[0] == 4


def test_gguf_with_one_tensor_per_expert(tmp_path: Path) -> None:
    """Mixtral GGUFs converted before llama.cpp stacked experts name each one: `blk.N.ffn_gate.E.weight`."""
    hf = tiny_hf_model("mixtral", vocab_size=TINY_VOCAB_SIZE, **ARCHS["mixtral"])
    path = write_tiny_gguf(
        tmp_path / "old.gguf", hf, qtype="Q8_0", tokenizer_kind="gpt2", legacy_experts=True
    )
    bundle = load_model(path)
    names = {w.name for w in bundle.iter_weights()}
    assert "model.layers.1.block_sparse_moe.experts.3.w3.weight" in names
    assert not any(name.endswith("experts.w3.weight") for name in names)
    hf.load_state_dict(hf_state_per_expert(list(bundle.iter_weights())), strict=False)
    assert np.abs(prompt_logits(runner_for("torch", bundle), PROMPT) - hf_logits(hf, PROMPT)).max() < ATOL


def hf_state_per_expert(weights: list[WeightTensor]) -> dict[str, torch.Tensor]:
    """hf_state for files with one tensor per expert: stack them first."""
    grouped: dict[str, list[tuple[int, WeightTensor]]] = defaultdict(list)
    rest = []
    for w in weights:
        match = re.fullmatch(r"(.+\.experts)\.(\d+)\.(\w+\.weight)", w.name)
        if match:
            grouped[f"{match[1]}.{match[3]}"].append((int(match[2]), w))
        else:
            rest.append(w)
    for name, experts in grouped.items():
        data = np.stack([np.array(w.dequantize()) for _, w in sorted(experts, key=lambda item: item[0])])
        rest.append(WeightTensor(name, data.shape, "F32", data))
    return hf_state(rest)


def test_torch_keeps_gguf_experts_quantized_in_bfloat16(tmp_path: Path) -> None:
    hf = tiny_hf_model("mixtral", vocab_size=TINY_VOCAB_SIZE, **ARCHS["mixtral"])
    path = write_tiny_gguf(tmp_path / "moe.gguf", hf, qtype="Q8_0", tokenizer_kind="gpt2")
    bundle = load_model(path)
    hf.load_state_dict(hf_state(list(bundle.iter_weights())), strict=False)
    runner = runner_for("torch", bundle, "bfloat16")
    expert = runner.model.layers[0].moe.experts[0]
    if runner.quant.kernels is None and not runner.quant.int4:
        pytest.skip("no quantized kernel on this CPU: every GGUF weight is dequantized")
    assert not isinstance(expert.gate_up, torch.Tensor) and not isinstance(expert.down, torch.Tensor)
    ours, ref = prompt_logits(runner, PROMPT), hf_logits(hf, PROMPT)
    cos = (ours * ref).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(ref, axis=-1))
    assert cos.min() > 0.99


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_hub_folder_with_per_expert_names(tmp_path: Path, backend: str, model_type: str) -> None:
    """save_pretrained writes what the hub holds: `experts.N.gate_proj` / Mixtral's `block_sparse_moe.experts.N.w1`."""
    hf = tiny_hf_model(model_type, **ARCHS[model_type])
    hf.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        names = set(f.keys())
    expert_names = {
        "qwen3_moe": "model.layers.0.mlp.experts.3.gate_proj.weight",
        "mixtral": "model.layers.0.block_sparse_moe.experts.3.w1.weight",
    }
    assert expert_names[model_type] in names
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    runner = runner_for(backend, load_model(tmp_path))
    assert np.abs(prompt_logits(runner, PROMPT) - hf_logits(hf, PROMPT)).max() < ATOL


def test_split_experts_slices_quantized_rows_without_copying() -> None:
    rows = np.arange(4 * 3 * 34, dtype=np.uint8).reshape(12, 34)  # 4 experts x 3 rows of one Q8_0 block
    stacked = WeightTensor("model.layers.0.mlp.experts.gate_proj.weight", (4, 3, 32), "Q8_0", rows)
    other = WeightTensor("model.layers.0.mlp.gate.weight", (4, 32), "F32", np.zeros((4, 32), np.float32))
    out = list(split_experts([stacked, other]))
    assert [w.name for w in out] == [f"model.layers.0.mlp.experts.{e}.gate_proj.weight" for e in range(4)] + [
        other.name
    ]
    assert out[2].shape == (3, 32) and np.shares_memory(out[2].data, rows)
    assert (out[2].data == rows[6:9]).all()


def test_registry_maps_every_expert_index() -> None:
    arch = architecture("mixtral")
    assert arch.layer_weight("block_sparse_moe.experts.17.w3.weight") == ("moe.experts.17.gate_up", 1, 2)
    assert arch.layer_weight("mlp.experts.2.gate_up_proj") == ("moe.experts.2.gate_up", 0, 1)
    assert arch.layer_weight("block_sparse_moe.experts.1.w9.weight") is None
    assert architecture("qwen3_moe").layer_weight("mlp.gate_proj.weight") == ("gate_up", 0, 2)


def test_moe_spec_reads_sparse_layers_and_rejects_nonsense() -> None:
    def config(**extra: Any) -> ModelConfig:
        return ModelConfig("qwen3_moe", 256, 64, 128, 4, 4, 2, 16, extra=extra)

    spec = MoeSpec.from_config(config(num_local_experts=8, num_experts_per_tok=2, decoder_sparse_step=2))
    assert spec.sparse_layers == {1, 3} and spec.expert_size == 128 and spec.experts == 8
    spec = MoeSpec.from_config(config(num_experts=8, num_experts_per_tok=2, mlp_only_layers=[0]))
    assert spec.sparse_layers == {1, 2, 3}
    with pytest.raises(ModelLoadError, match="experts"):
        MoeSpec.from_config(config(num_experts=2, num_experts_per_tok=3))


@pytest.mark.mlx
def test_mlx_experts_in_mixed_formats_stack_apart() -> None:
    """gather_qmm needs one quantized format per stack; a Q4_0 gate next to a Q8_0 up (as a mixed-quant
    file may hold) stacks as two quantized row blocks (RowStacks, one gathered matmul each), same values."""
    mx = pytest.importorskip("mlx.core")
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from localchat.backends.mlx.models.moe import RowStacks, SparseMoe
    from localchat.backends.mlx.quant import QuantizedWeight, to_weight

    spec = MoeSpec(experts=2, top_k=1, renormalize=True, expert_size=32, sparse_layers=frozenset({0}))
    moe = SparseMoe(spec, hidden=64)
    rng = np.random.default_rng(0)

    def gguf_weight(qtype: str, rows: int, cols: int) -> WeightTensor:
        blocks = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGMLQuantizationType[qtype])
        return WeightTensor("w", (rows, cols), qtype, blocks)

    moe.router = router_weight = to_weight(gguf_weight("Q8_0", 2, 64), mx.float32)
    sources = []
    for expert in moe.experts:
        gate, up, down = gguf_weight("Q4_0", 32, 64), gguf_weight("Q8_0", 32, 64), gguf_weight("Q8_0", 64, 32)
        expert.gate_up = [to_weight(gate, mx.float32), to_weight(up, mx.float32)]
        expert.down = to_weight(down, mx.float32)
        sources.append((np.concatenate((gate.dequantize(), up.dequantize())), down.dequantize()))
    moe.finish()
    assert isinstance(moe.gate_up, RowStacks)
    assert [(p.bits, p.packed.shape[0]) for p in moe.gate_up.parts if isinstance(p, QuantizedWeight)] == [
        (4, 2),
        (8, 2),
    ]
    x = rng.standard_normal((3, 64)).astype(np.float32)
    out = np.array(moe.forward(mx.array(x)))
    router = np.array(
        mx.dequantize(router_weight.packed, router_weight.scales, router_weight.biases, group_size=32, bits=8)
    )
    for t in range(3):  # top-1: the token's output is its best expert's SwiGLU, weight 1
        gate_up, down = sources[int((router @ x[t]).argmax())]
        h = gate_up @ x[t]
        act = h[:32] / (1 + np.exp(-h[:32])) * h[32:]
        np.testing.assert_allclose(out[t], down @ act, rtol=1e-4, atol=1e-4)
