"""Llama 4 text model against transformers (fp32), torch runner: RoPE on (x0, x1) pairs with the L2 q/k
norm, NoPE layers with the position-dependent q temperature (floor_scale 4, so it changes within the
prompts), top-1 sigmoid routing that scales the expert's input plus a shared expert, interleaved dense
layers of their own width; the multimodal checkpoint's text LM; llama.cpp's llama4 GGUF; the context
capped at one chunk.

The parity suite's paged-cache checks run here on this module's own `pair` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import MODEL_ARCH, GGUFWriter, get_tensor_name_map
from tokenizers import Tokenizer, models

from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.backends.test_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.parity import PROMPT, assert_close, hf_logits
from tests.helpers.tiny_gguf import (
    TINY_VOCAB_SIZE,
    _add_tensor,
    _llama3_factors,
    _write_hparams,
    _write_tokenizer,
)
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import LLAMA3_ROPE, bundle_from_hf, fp32_runner, tiny_hf_model

BASE: dict[str, Any] = {
    "num_hidden_layers": 4,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "floor_scale": 4,
    "attn_scale": 0.5,
}
VARIANTS: dict[str, dict[str, Any]] = {
    # Scout's shape: every layer MoE, llama3 rope scaling, q/k norm on the rope layers.
    "llama4": {**BASE, "rope_parameters": LLAMA3_ROPE},
    # Maverick's: dense and MoE layers interleaved, top-2, no q/k norm.
    "llama4-interleaved": {
        **BASE,
        "interleave_moe_layer_step": 2,
        "num_experts_per_tok": 2,
        "use_qk_norm": False,
        "no_rope_layers": [1, 0, 1, 1],
    },
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_hf_model("llama4_text", **VARIANTS[request.param])
    return hf, fp32_runner(bundle_from_hf(hf))


def test_layers_follow_the_config() -> None:
    hf = tiny_hf_model("llama4_text", **VARIANTS["llama4-interleaved"])
    runner = fp32_runner(bundle_from_hf(hf))
    layers = list(runner.model.layers)
    assert [layer.rope for layer in layers] == [True, False, True, True]
    assert [layer.moe is not None for layer in layers] == [False, True, False, True]
    assert tuple(layers[0].gate_up.shape) == (192, 64)  # intermediate_size_mlp


def test_context_is_capped_at_one_attention_chunk() -> None:
    d = tiny_hf_model("llama4_text", **BASE).config.to_dict()
    assert ModelConfig.from_hf_dict({**d, "attention_chunk_size": 64}).max_position_embeddings == 64
    assert ModelConfig.from_hf_dict({**d, "attention_chunk_size": None}).max_position_embeddings == 512


def test_multimodal_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    """Llama4ForConditionalGeneration's files: language_model.* renamed, vision model and projector
    skipped, the stacked experts transposed."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    text = tiny_hf_model("llama4_text", **VARIANTS["llama4"]).config.to_dict()
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"image_size": 32, "patch_size": 16, "vision_output_dim": 32, "projector_input_dim": 32}
    vision |= {"projector_output_dim": 64, "pixel_shuffle_ratio": 0.5}
    torch.manual_seed(0)
    hf = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision))
    with torch.no_grad():
        for name, param in hf.named_parameters():
            norm = name.endswith("norm.weight")
            param.copy_((1.0 if norm else 0.0) + (0.2 if norm else 0.15) * torch.randn_like(param))
    hf.eval().save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "llama4_text"
    with torch.no_grad():  # its text LM directly: the wrapper's forward breaks without images (5.24)
        ref = hf.language_model(input_ids=torch.tensor([PROMPT * 2])).logits[0].float()
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, ref)


def write_llama4_gguf(path: Path, hf: torch.nn.Module) -> Path:
    """The text model as llama.cpp's Llama4Model converter writes it: q/k rows unpermuted, feed_forward_length
    the dense layers' width and expert_feed_forward_length the experts', experts split into gate / up /
    down stacks [experts, out, in], llama3 rope scaling as rope_freqs, names from the gguf package's own
    llama4 map, Q8_0 matrices."""
    cfg = hf.config.to_dict()
    names = get_tensor_name_map(MODEL_ARCH.LLAMA4, cfg["num_hidden_layers"])
    writer = GGUFWriter(path, "llama4")
    _write_hparams(writer, {**cfg, "intermediate_size": cfg["intermediate_size_mlp"]})
    writer.add_expert_count(cfg["num_local_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    writer.add_interleave_moe_layer_step(cfg["interleave_moe_layer_step"])
    writer.add_expert_feed_forward_length(cfg["intermediate_size"])
    _write_tokenizer(writer, cfg, "gpt2", "smollm", None, None, None)
    for name, tensor in hf.state_dict().items():
        data = tensor.detach().float().numpy()
        if name.endswith("experts.gate_up_proj"):  # [E, H, 2I] -> gate, up [E, I, H]
            gate, up = np.split(np.swapaxes(data, 1, 2), 2, axis=1)
            for part, stack in (("gate_proj", gate), ("up_proj", up)):
                target = names.get_name(name.replace("gate_up_proj", f"{part}.weight"), (".weight",))
                _add_tensor(writer, str(target), np.ascontiguousarray(stack), "Q8_0")
            continue
        if name.endswith("experts.down_proj"):  # [E, I, H] -> [E, H, I]
            data, name = np.swapaxes(data, 1, 2), name + ".weight"
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        _add_tensor(writer, target, np.ascontiguousarray(data), "F32" if "ffn_gate_inp" in target else "Q8_0")
    scaling = cfg["rope_parameters"]
    writer.add_tensor("rope_freqs.weight", _llama3_factors(scaling, scaling["rope_theta"], cfg["head_dim"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_matches_transformers_on_dequantized_weights(tmp_path: Path) -> None:
    # llama.cpp records no temperature settings: it uses transformers' defaults (floor 8192, scale 0.1).
    overrides = {"floor_scale": 8192, "attn_scale": 0.1, "vocab_size": TINY_VOCAB_SIZE}
    hf = tiny_hf_model("llama4_text", **{**VARIANTS["llama4"], **overrides})
    bundle = load_model(write_llama4_gguf(tmp_path / "llama4.gguf", hf))
    c = bundle.config
    assert (c.model_type, c.intermediate_size, c.extra["intermediate_size_mlp"]) == ("llama4_text", 32, 96)
    assert c.extra["use_qk_norm"] and c.rope_scaling is not None and c.rope_scaling["rope_type"] == "llama3"
    weights = list(bundle.iter_weights())
    assert any(w.dtype == "Q8_0" for w in weights if ".experts." in w.name)
    state: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[str, np.ndarray]] = {}
    for w in weights:  # back to transformers' layout: experts [E, in, out], gate | up side by side
        prefix, sep, leaf = w.name.partition("experts.")
        if sep:
            stacks.setdefault(prefix, {})[leaf] = np.array(w.dequantize())
        else:
            state[w.name] = torch.from_numpy(np.array(w.dequantize()))
    for prefix, parts in stacks.items():
        gate_up = np.concatenate((parts["gate_proj.weight"], parts["up_proj.weight"]), axis=1)
        state[prefix + "experts.gate_up_proj"] = torch.from_numpy(
            np.ascontiguousarray(np.swapaxes(gate_up, 1, 2))
        )
        down = np.swapaxes(parts["down_proj.weight"], 1, 2)
        state[prefix + "experts.down_proj"] = torch.from_numpy(np.ascontiguousarray(down))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
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

    hf = tiny_hf_model("llama4_text", **VARIANTS[variant])
    runner = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    driver = PagedDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(torch.from_numpy(np.array(logits)).float(), hf_logits(hf, PROMPT * 2))
    for _ in range(4):
        driver.feed("a", int(np.array(logits[-1]).argmax()))
        _, logits = driver.step_logits()
        assert_close(torch.from_numpy(np.array(logits[0])).float(), hf_logits(hf, driver.tokens("a"))[-1])
