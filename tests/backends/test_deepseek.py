"""DeepSeek-V2/V3 beyond the parity suite's VARIANTS: llama.cpp's "deepseek2" GGUF files (current split
attn_k_b / attn_v_b and the older attn_kv_b) against transformers on the dequantized weights, on both
backends; the sizes a GGUF's MLA metadata gives; the honest KV-cache size; checkpoint clean-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.arch.deepseek import MlaSpec, RouterSpec, sanitize
from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import ModelLoadError
from localchat.llm import LLM
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from localchat.weights.tensors import WeightTensor
from tests.backends.test_moe import ATOL, BACKENDS, hf_logits, hf_state, prompt_logits, runner_for
from tests.helpers.parity import tiny_tokenizer_json
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import (
    DEEPSEEK_YARN,
    VARIANTS,
    bundle_from_hf,
    exact_weights,
    fp32_runner,
    tiny_hf_model,
)

PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64] * 2
# (variant, llama.cpp layout): V3 with today's split kv_b; V2-Lite with yarn in a file from before the split.
FILES = [("deepseek_v3", "split"), ("deepseek_v2-lite", "legacy")]


def tiny(variant: str, **extra: Any) -> torch.nn.Module:
    model_type, overrides = VARIANTS[variant]
    return tiny_hf_model(model_type, vocab_size=TINY_VOCAB_SIZE, **{**overrides, **extra})


def deepseek_hf_state(bundle_weights: list[WeightTensor]) -> dict[str, torch.Tensor]:
    """transformers' state dict from a deepseek2 GGUF's (dequantized) tensors, as the file names them."""
    rest, split = [], {}
    for w in bundle_weights:
        if w.name.endswith((".k_b_proj.weight", ".v_b_proj.weight")):
            split[w.name] = w.dequantize()
        else:
            rest.append(w)
    state = {
        k.replace("e_score_correction.bias", "e_score_correction_bias"): v for k, v in hf_state(rest).items()
    }
    for name, k_b in split.items():
        if ".k_b_proj" not in name:
            continue
        v_b = split[name.replace("k_b_proj", "v_b_proj")]
        k = np.swapaxes(k_b, 1, 2)  # [heads, rank, nope] -> [heads, nope, rank]
        kv_b = np.concatenate((k, v_b), axis=1).reshape(-1, k_b.shape[1])
        state[name.replace("k_b_proj", "kv_b_proj")] = torch.from_numpy(np.ascontiguousarray(kv_b))
    return state


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("variant", "layout"), FILES)
def test_gguf_matches_transformers_on_dequantized_weights(
    tmp_path: Path, backend: str, variant: str, layout: str
) -> None:
    extra = {"rope_parameters": DEEPSEEK_YARN} if variant == "deepseek_v2-lite" else {}
    hf = tiny(variant, **extra)
    path = write_tiny_gguf(tmp_path / "ds.gguf", hf, qtype="Q8_0", legacy_kv_b=layout == "legacy")
    bundle = load_model(path)
    c = bundle.config
    assert c.model_type == "deepseek_v2"  # llama.cpp's deepseek2 serves both; the router is in the metadata
    assert (c.num_key_value_heads, c.head_dim, c.rotary_dim) == (4, 24, 8)
    router = RouterSpec.from_config(c)
    assert router.sigmoid == (variant == "deepseek_v3")
    assert (router.groups, router.groups_used) == ((2, 1) if variant == "deepseek_v3" else (1, 1))
    weights = list(bundle.iter_weights())
    names = {w.name for w in weights}
    assert ("model.layers.1.self_attn.k_b_proj.weight" in names) == (layout == "split")
    assert any(w.dtype == "Q8_0" for w in weights if ".experts." in w.name)
    missing, unexpected = hf.load_state_dict(deepseek_hf_state(weights), strict=False)
    assert not unexpected and not missing
    if variant == "deepseek_v2-lite":  # yarn's mscale² came back from 0.1 * mscale_all_dim
        reference = ModelConfig.from_hf_dict(hf.config.to_dict())
        assert MlaSpec.from_config(c).softmax_scale == pytest.approx(
            MlaSpec.from_config(reference).softmax_scale
        )
        assert MlaSpec.from_config(c).softmax_scale != pytest.approx(24**-0.5)
    logits = prompt_logits(runner_for(backend, bundle), PROMPT)
    assert np.abs(logits - hf_logits(hf, PROMPT)).max() < ATOL


def test_kv_cache_holds_expanded_heads_at_key_width() -> None:
    """The cache stores every head's key (nope + rope) and value padded to it: its size says so."""
    hf = tiny("deepseek_v3-halves")  # values 32 wide > keys 24: the cache takes the wider
    runner = fp32_runner(bundle_from_hf(hf))
    spec = runner.kv_cache_spec
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype_bytes) == (2, 4, 32, 4)
    assert spec.bytes_per_block(16) == 2 * 2 * 16 * 4 * 32 * 4
    runner.initialize_kv_cache(4, 16)
    assert tuple(runner.kv_caches[0].shape) == (2, 4, 4 * 16, 32)


def test_sanitize_drops_mtp_layers_and_deinterleaves_rope_rows() -> None:
    config = ModelConfig.from_hf_dict(tiny("deepseek_v3").config.to_dict())
    rows = np.arange(40, dtype=np.float32)[:, None] * np.ones((1, 64), np.float32)  # row i holds i
    weights = [
        WeightTensor("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", (40, 64), "F32", rows),
        WeightTensor("model.layers.2.self_attn.kv_a_proj_with_mqa.weight", (40, 64), "F32", rows),  # MTP
    ]
    out = list(sanitize(config, weights))
    assert [w.name for w in out] == ["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    # latent rows 0..31 stay; the rope pairs (32, 33), (34, 35), ... become evens then odds
    assert out[0].data[:, 0].tolist() == [*range(32), 32, 34, 36, 38, 33, 35, 37, 39]


def test_hf_config_sizes_ignore_transformers_head_dim() -> None:
    """transformers saves head_dim = qk_rope_head_dim and V3's num_key_value_heads = 128 by default."""
    d = tiny("deepseek_v3").config.to_dict()
    assert d["head_dim"] == 8 and d["num_key_value_heads"] == 4
    c = ModelConfig.from_hf_dict({**d, "num_key_value_heads": 128})
    assert (c.num_key_value_heads, c.head_dim, c.rotary_dim) == (4, 24, 8)


def test_torch_bfloat16_keeps_gguf_mla_projections_quantized(tmp_path: Path) -> None:
    """bf16 on the CPU kernels: the MLA projections stay in their GGUF blocks; prompt and decode steps
    (the fused decode attention over kv_heads = heads) track transformers on the dequantized weights."""
    hf = tiny("deepseek_v3", q_lora_rank=32, v_head_dim=16)  # every projection's rows split into 32s
    path = write_tiny_gguf(tmp_path / "ds.gguf", hf, qtype="Q8_0", legacy_kv_b=True)
    bundle = load_model(path)
    hf.load_state_dict(deepseek_hf_state(list(bundle.iter_weights())), strict=False)
    runner = runner_for("torch", bundle, "bfloat16")
    if runner.quant.kernels is None and not runner.quant.int4:
        pytest.skip("no quantized kernel on this CPU: every GGUF weight is dequantized")
    layer = runner.model.layers[1]
    assert not any(isinstance(getattr(layer, n), torch.Tensor) for n in ("q_a", "q", "kv_a", "kv_b", "o"))
    assert layer.moe.router.dtype == layer.moe.score_bias.dtype == torch.float32  # registry: float32_params
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    tokens, rows = list(PROMPT), [logits[-1].float().numpy()]
    for _ in range(4):
        tokens.append(int(logits[-1].argmax()))
        driver.feed("a", tokens[-1])
        _, logits = driver.step_logits()
        rows.append(logits[-1].float().numpy())
    ours, ref = np.stack(rows), hf_logits(hf, tokens)[len(PROMPT) - 1 :]
    cos = (ours * ref).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(ref, axis=-1))
    assert cos.min() > 0.99


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["deepseek_v2", "deepseek_v3"])
def test_hub_folder_loads_through_safetensors(tmp_path: Path, backend: str, variant: str) -> None:
    """save_pretrained writes the hub's layout (per-expert names, V3's e_score_correction_bias)."""
    hf = tiny(variant)
    hf.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in names
    assert ("model.layers.1.mlp.gate.e_score_correction_bias" in names) == (variant == "deepseek_v3")
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    runner = runner_for(backend, load_model(tmp_path))
    assert np.abs(prompt_logits(runner, PROMPT) - hf_logits(hf, PROMPT)).max() < ATOL


def test_router_rules_from_config_and_damaged_configs() -> None:
    d = tiny("deepseek_v3").config.to_dict()
    rule = RouterSpec.from_config(ModelConfig.from_hf_dict(d))
    assert (rule.sigmoid, rule.groups, rule.groups_used, rule.renormalize, rule.scale) == (
        True,
        2,
        1,
        True,
        2.5,
    )
    greedy = ModelConfig.from_hf_dict({**d, "model_type": "deepseek_v2", "topk_method": "greedy"})
    assert RouterSpec.from_config(greedy).groups == 1  # V2-Lite: n_group set, but no group limit
    for bad in ({"n_group": 3}, {"n_group": 4}, {"scoring_func": "sqrtsoftplus"}):
        with pytest.raises(ModelLoadError):
            RouterSpec.from_config(ModelConfig.from_hf_dict({**d, **bad}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_batch_from_a_gguf_matches_transformers_greedy(tmp_path: Path, backend: str) -> None:
    """The whole path: a deepseek2 file through `LLM` (tokenizer, engine, continuous batching of two
    prompts of different lengths) gives transformers' greedy tokens on the dequantized weights."""
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    hf = tiny("deepseek_v3")
    path = write_tiny_gguf(tmp_path / "ds.gguf", hf, qtype="Q8_0")
    hf.load_state_dict(deepseek_hf_state(list(load_model(path).iter_weights())), strict=False)
    with exact_weights():
        llm = LLM(path, backend=backend, device="cpu", dtype="float32")
    prompts = [PROMPT, PROMPT[:7]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, attention_mask=None)
        assert out.token_ids == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_torch_bfloat16_decode_tracks_transformers_with_either_kv_cache(kv_cache_dtype: str) -> None:
    """The expanded keys and zero-padded values go through the bf16 and the int8 paged caches alike."""
    hf = tiny("deepseek_v2")
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions("cpu", "bfloat16", kv_cache_dtype=kv_cache_dtype))
    assert runner.kv_cache_spec.head_dim == 24 and runner.kv_cache_spec.num_kv_heads == 4
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    tokens, rows = list(PROMPT), [logits[-1].float().numpy()]
    for _ in range(6):
        tokens.append(int(logits[-1].argmax()))
        driver.feed("a", tokens[-1])
        _, logits = driver.step_logits()
        rows.append(logits[-1].float().numpy())
    ours, ref = np.stack(rows), hf_logits(hf, tokens)[len(PROMPT) - 1 :]
    cos = (ours * ref).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(ref, axis=-1))
    assert cos.min() > 0.99
