"""`--speculative mtp` on GLM-4.5's nextn layer (the DeepSeek-V3 layout after the model's own layers:
eh_proj, enorm, hnorm, shared_head.norm / head, and a decoder layer of the model's kind with its MoE), on
a tiny random GLM-4.5-style model (float32; q/k/v biases, q/k norm, grouped sigmoid routing): every draft
equals a plain-torch reference written from vLLM's `glm4_moe_mtp` definition (transformers' own GLM-4.5
MoE layer as the layer; the first position's embedding zeroed; the layer's output fed to the next draft
before the norm), and greedy and seeded output equal plain decoding."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.mtp_proposer import attach_mtp
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor
from tests.backends.test_glm4_moe import VARIANTS
from tests.helpers.fake_engine import drain
from tests.helpers.mtp import recorded
from tests.helpers.torch_models import fp32_runner, tiny_hf_model

VOCAB = 256


def nextn_tensors(hf: Any, seed: int) -> dict[str, torch.Tensor]:
    """A random nextn layer `model.layers.{L}.*`: the last (MoE) layer's names and shapes, and the head's."""
    gen = torch.Generator().manual_seed(seed)
    layers, hidden = hf.config.num_hidden_layers, hf.config.hidden_size
    src, dst = f"model.layers.{layers - 1}.", f"model.layers.{layers}."

    def rand(*shape: int, norm: bool = False) -> torch.Tensor:
        return (
            1.0 + 0.2 * torch.randn(*shape, generator=gen)
            if norm
            else 0.15 * torch.randn(*shape, generator=gen)
        )

    out = {
        dst + k[len(src) :]: rand(*v.shape, norm=k.endswith("norm.weight"))
        for k, v in hf.state_dict().items()
        if k.startswith(src)
    }
    out[dst + "eh_proj.weight"] = rand(hidden, 2 * hidden)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        out[f"{dst}{norm}.weight"] = rand(hidden, norm=True)
    out[dst + "shared_head.head.weight"] = rand(VOCAB, hidden)
    out[dst + "embed_tokens.weight"] = hf.model.embed_tokens.weight.detach().clone()
    return out


def bundle(hf: Any, nextn: dict[str, torch.Tensor]) -> ModelBundle:
    config = ModelConfig.from_hf_dict({**hf.config.to_dict(), "num_nextn_predict_layers": 1})
    state = {**{k: v.detach().clone() for k, v in hf.state_dict().items()}, **nextn}

    def iter_weights() -> Any:
        for key, tensor in state.items():
            yield WeightTensor(key, tuple(tensor.shape), "F32", tensor.numpy())

    path = Path("tiny-glm")
    return ModelBundle("tiny-glm", path, "safetensors", config, iter_weights, tokenizer=None)  # type: ignore[arg-type]


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Reference:
    def __init__(self, hf: Any, nextn: dict[str, torch.Tensor]) -> None:
        self.hf, self.eps = hf, hf.config.rms_norm_eps
        prefix = f"model.layers.{hf.config.num_hidden_layers}."
        self.w = {k[len(prefix) :]: v for k, v in nextn.items()}
        self.layer = copy.deepcopy(hf.model.layers[hf.config.num_hidden_layers - 1])
        self.layer.load_state_dict(
            {k: v for k, v in self.w.items() if k.startswith(("self_attn.", "mlp.", "input_", "post_"))}
        )

    def run(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        w, eps = self.w, self.eps
        embeds = embeds.masked_fill((positions == 0)[:, None], 0.0)
        x = (
            torch.cat([rms(embeds, w["enorm.weight"], eps), rms(hidden, w["hnorm.weight"], eps)], -1)
            @ w["eh_proj.weight"].T
        )
        n = x.shape[0]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        rope = self.hf.model.rotary_emb(x[None], positions[None])
        out = self.layer(x[None], position_embeddings=rope, attention_mask=mask, position_ids=positions[None])
        return (out[0] if isinstance(out, tuple) else out)[0]

    def drafts(self, tokens: list[int], computed: int, k: int) -> list[int]:
        w, eps = self.w, self.eps
        with torch.no_grad():
            hidden = self.hf.model(torch.tensor([tokens[:computed]])).last_hidden_state[0]
            embed = self.hf.model.embed_tokens.weight
            rows = embed[torch.tensor(tokens[1 : computed + 1])]
            positions = torch.arange(computed)
            drafts: list[int] = []
            while True:
                out = self.run(rows, hidden, positions)
                logits = rms(out[-1], w["shared_head.norm.weight"], eps) @ w["shared_head.head.weight"].T
                drafts.append(int(logits.argmax()))
                if len(drafts) == k:
                    return drafts
                rows = torch.cat([rows, embed[drafts[-1]][None]])
                hidden = torch.cat([hidden, out[-1:]])  # the output before the norm
                positions = torch.arange(len(positions) + 1)


def engine(target: ModelBundle, method: str) -> LLMEngine:
    runner = fp32_runner(target)
    proposer = attach_mtp(runner, target.iter_weights(), "tiny-glm", VOCAB) if method == "mtp" else None
    cfg = EngineConfig(kv_cache_mib=8, block_size=4, speculative=SpeculativeConfig(method, num_tokens=3))
    return LLMEngine(
        runner, FakeTokenizer(), cfg, eos_token_ids=[], model_max_len=256, proposer=proposer, vocab_size=VOCAB
    )


def run(eng: LLMEngine, params: SamplingParams) -> list[list[int]]:
    rng = np.random.default_rng(3)
    ids = [eng.add_request([int(t) for t in rng.integers(3, VOCAB, size=n)], params) for n in (17, 23)]
    got: dict[str, list[int]] = {r: [] for r in ids}
    for out in drain(eng):
        got[out.req_id] += out.new_token_ids
    return [got[r] for r in ids]


@pytest.fixture(scope="module")
def hf() -> Any:
    return tiny_hf_model("glm4_moe", **VARIANTS["glm4_moe"])


def test_drafts_equal_the_reference(hf: Any) -> None:
    nextn = nextn_tensors(hf, seed=1)
    eng = engine(bundle(hf, nextn), "mtp")
    proposer: Any = eng.scheduler.proposer
    seen = recorded(proposer)
    run(eng, SamplingParams(max_tokens=20, temperature=0.0))
    assert len(seen) >= 6
    reference = Reference(hf, nextn)
    for tokens, computed, k, drafts in seen:
        assert drafts == reference.drafts(tokens, computed, k)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_output_equals_plain_decoding(hf: Any, temperature: float) -> None:
    target = bundle(hf, nextn_tensors(hf, seed=1))
    params = SamplingParams(max_tokens=20, temperature=temperature, seed=5)
    eng = engine(target, "mtp")
    assert run(eng, params) == run(engine(target, "off"), params)
    assert eng.spec_draft_tokens > 0


def write_gguf(path: Path, hf: Any, nextn: dict[str, torch.Tensor]) -> Path:
    """The model as llama.cpp's glm4moe converter writes it (test_glm4_moe.write_glm4_moe_gguf's way, F32
    here), with `nextn` as its multi-token-prediction block: the layer under block names, the head's own
    tensors as `blk.{L}.nextn.*`."""
    from gguf import MODEL_ARCH, ExpertGatingFuncType, GGUFWriter, get_tensor_name_map

    from tests.helpers.tiny_gguf import _add_tensor, _write_hparams, _write_tokenizer

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
    own = {"eh_proj", "enorm", "hnorm", "shared_head.norm", "shared_head.head", "embed_tokens"}
    state = {k: v.detach().float().numpy() for k, v in {**hf.state_dict(), **nextn}.items()}
    for name, data in state.items():
        rest = name.split(".", 3)[3] if name.startswith("model.layers.") else ""
        if rest.removesuffix(".weight") in own:
            gguf = f"blk.{layers}.nextn.{rest.removesuffix('.weight').replace('.', '_')}.weight"
            writer.add_tensor(gguf, np.ascontiguousarray(data))
            continue
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H] -> gate and up stacks
            stem = name.removesuffix("gate_up_proj")
            gate, up = np.split(data, 2, axis=1)
            for part, stack in (("gate_proj", gate), ("up_proj", up)):
                _add_tensor(writer, str(names.get_name(f"{stem}{part}.weight", (".weight",))), stack, "F32")
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if name.endswith("mlp.experts.down_proj"):
            gguf_name = names.get_name(name + ".weight", try_suffixes=(".weight",))
        assert gguf_name is not None, name
        _add_tensor(writer, gguf_name, np.ascontiguousarray(data), "F32")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_nextn_block_drafts_like_the_reference(tmp_path: Path) -> None:
    from localchat.serving.mtp import has_mtp_head, mtp_proposer_for
    from localchat.weights.loader import load_model
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE

    overrides = {"partial_rotary_factor": 0.5, "n_group": 1, "topk_group": 1, "vocab_size": TINY_VOCAB_SIZE}
    hf: Any = tiny_hf_model("glm4_moe", **{**VARIANTS["glm4_moe"], **overrides})
    nextn = nextn_tensors(hf, seed=2)
    nextn[f"model.layers.{hf.config.num_hidden_layers}.shared_head.head.weight"] = 0.15 * torch.randn(
        TINY_VOCAB_SIZE, hf.config.hidden_size, generator=torch.Generator().manual_seed(3)
    )
    bundle_ = load_model(write_gguf(tmp_path / "glm.gguf", hf, nextn))
    assert bundle_.config.num_hidden_layers == hf.config.num_hidden_layers and has_mtp_head(bundle_)
    runner = fp32_runner(bundle_)
    proposer: Any = mtp_proposer_for(runner, bundle_, "glm")
    cfg = EngineConfig(kv_cache_mib=8, block_size=4, speculative=SpeculativeConfig("mtp", num_tokens=3))
    eng = LLMEngine(
        runner,
        bundle_.tokenizer,
        cfg,
        eos_token_ids=[],
        model_max_len=256,
        proposer=proposer,
        vocab_size=TINY_VOCAB_SIZE,
    )
    seen = recorded(proposer)
    run(eng, SamplingParams(max_tokens=16, temperature=0.0))
    assert seen
    reference = Reference(hf, nextn)
    for tokens, computed, k, drafts in seen:
        assert drafts == reference.drafts(tokens, computed, k)
