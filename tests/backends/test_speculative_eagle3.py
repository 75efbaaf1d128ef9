"""EAGLE-3 heads (backends/torch/eagle3_head.py, eagle3_proposer.py) on a tiny random Llama target with
the fake tokenizer.

- The head's forward equals the documented EAGLE-3 layer built from transformers' Llama pieces (RMSNorm,
  rotary, MLP, eager attention) on the same random weights: logits over a sequence of target rows and a
  draft step fed its own output.
- Constructed heads whose acceptance is known: with a target whose next token depends only on the current
  token (attention and MLP outputs zeroed), a head that routes the embedded next token to its output
  through self-attention and reads the target's LM head drafts every token right (~100% kept, k + 1
  tokens per pass); the same through a permuted d2t. A head reading only the fused hidden states predicts
  one token too early: it catches an off-by-one in the rows it is fed.
- Greedy and seeded output is token-identical to plain decoding with rows with and without drafts in one
  step (8 requests, max_batch 6), with some drafts kept and some rolled back.
- Typed errors: a head for another hidden size or vocabulary, a folder that is not an EAGLE-3 head.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from localchat.backends.fake import EOS_ID, FakeTokenizer
from localchat.backends.torch.eagle3_head import Eagle3Head, Eagle3LoadError
from localchat.backends.torch.eagle3_proposer import Eagle3Proposer, _Feed, _State
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from tests.backends.test_speculative_torch import MODEL_VOCAB, logprob_values, prompts, run, summary
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

HIDDEN, HEADS, HEAD_DIM, FFN, LAYERS = 64, 4, 16, 96, 4
# Attention and MLP outputs scaled by this: the echo head's drafts are kept about a quarter of the time.
DAMPING = 0.1


@pytest.fixture(scope="module")
def target_hf() -> torch.nn.Module:
    return tiny_hf_model("llama", vocab_size=MODEL_VOCAB, num_hidden_layers=LAYERS)


@pytest.fixture(scope="module")
def target(target_hf: torch.nn.Module) -> ModelBundle:
    return bundle_from_hf(target_hf)


def damped(target_hf: torch.nn.Module, scale: float) -> torch.nn.Module:
    """The target with every attention and MLP output scaled: at 0 its next token is f(current token);
    a little above, the context changes it now and then."""
    model: Any = copy.deepcopy(target_hf)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def memoryless_hf(target_hf: torch.nn.Module) -> torch.nn.Module:
    return damped(target_hf, 0.0)


def random_head(seed: int = 0, kv_heads: int = 2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.15) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen)

    def norm() -> torch.Tensor:
        return 1.0 + rand(HIDDEN, scale=0.2)

    return {
        "fc.weight": rand(HIDDEN, 3 * HIDDEN),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.mlp.gate_proj.weight": rand(FFN, HIDDEN),
        "midlayer.mlp.up_proj.weight": rand(FFN, HIDDEN),
        "midlayer.mlp.down_proj.weight": rand(HIDDEN, FFN),
        "norm.weight": norm(),
        "lm_head.weight": rand(MODEL_VOCAB, HIDDEN),
    }


def write_head(
    folder: Path,
    tensors: dict[str, torch.Tensor],
    *,
    speculators_layout: bool = False,
    kv_heads: int = 2,
    **extra: Any,
) -> Path:
    """A head checkpoint: vLLM / SpecForge's config and `midlayer.` names, or speculators' nested config
    and `layers.0.` names."""
    folder.mkdir(parents=True, exist_ok=True)
    layer = {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": kv_heads,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": MODEL_VOCAB,
    }
    draft_vocab = tensors["lm_head.weight"].shape[0]
    if speculators_layout:
        config: dict[str, Any] = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer,
            "draft_vocab_size": draft_vocab,
        }
        tensors = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    else:
        config = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "draft_vocab_size": draft_vocab}
    config.update(extra)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def echo_head(target_hf: Any, permutation: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A head whose output is the normed embedding of the token it is given: q and k are one constant
    vector (biases only), so RoPE makes each row attend to itself; v and o pass the embedding half
    through; the hidden state is normed to zero and is the residual (norm_before_residual); the MLP
    adds nothing. Its norm and LM head are the target's, so it drafts f(token) of a memoryless target."""
    tensors = random_head(kv_heads=HEADS)
    eye = torch.eye(HIDDEN)
    tensors["midlayer.hidden_norm.weight"] = torch.zeros(HIDDEN)
    tensors["midlayer.input_layernorm.weight"] = torch.ones(HIDDEN)
    tensors["midlayer.self_attn.q_proj.weight"] = torch.zeros(HIDDEN, 2 * HIDDEN)
    tensors["midlayer.self_attn.k_proj.weight"] = torch.zeros(HIDDEN, 2 * HIDDEN)
    tensors["midlayer.self_attn.q_proj.bias"] = torch.full((HIDDEN,), 20.0)
    tensors["midlayer.self_attn.k_proj.bias"] = torch.full((HIDDEN,), 20.0)
    tensors["midlayer.self_attn.v_proj.weight"] = torch.cat([eye, torch.zeros(HIDDEN, HIDDEN)], dim=1)
    tensors["midlayer.self_attn.o_proj.weight"] = eye
    tensors["midlayer.mlp.down_proj.weight"] = torch.zeros(HIDDEN, FFN)
    tensors["norm.weight"] = target_hf.model.norm.weight.detach().clone()
    lm_head = target_hf.lm_head.weight.detach().clone()
    if permutation is not None:
        # Draft id j is target id permutation[j]: d2t[j] = permutation[j] - j.
        lm_head = lm_head[permutation]
        tensors["d2t"] = permutation - torch.arange(len(permutation))
    tensors["lm_head.weight"] = lm_head
    return tensors


def make_engine(target: ModelBundle, head: Path | None, max_batch: int = 4, k: int = 4) -> LLMEngine:
    spec = SpeculativeConfig("eagle" if head else "off", num_tokens=k, max_batch=max_batch)
    runner = fp32_runner(target)
    proposer = runner.eagle3_proposer(str(head), "tiny", MODEL_VOCAB) if head else None
    return LLMEngine(
        runner,
        FakeTokenizer(),
        EngineConfig(kv_cache_mib=16, block_size=4, speculative=spec),
        eos_token_ids=[EOS_ID],
        model_max_len=512,
        vocab_size=MODEL_VOCAB,
        proposer=proposer,
    )


# -- the head's forward against transformers' Llama pieces ------------------------------------------


def reference_logits(
    tensors: dict[str, torch.Tensor], aux: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-3's layer over rows 0..n-1 in one causal pass, plus one more row that reads row n-1's output
    as its hidden state (a draft step): (logits [n + 1, vocab], outputs [n + 1, hidden])."""
    w = {k.replace("midlayer.", ""): v for k, v in tensors.items()}
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        rms_norm_eps=1e-6,  # RoPE theta: transformers' default 10000, as in write_head
    )

    def rms(weight: torch.Tensor) -> LlamaRMSNorm:
        module = LlamaRMSNorm(HIDDEN, eps=1e-6)
        module.weight.data.copy_(weight)
        return module

    mlp = LlamaMLP(config)
    mlp.gate_proj.weight.data.copy_(w["mlp.gate_proj.weight"])
    mlp.up_proj.weight.data.copy_(w["mlp.up_proj.weight"])
    mlp.down_proj.weight.data.copy_(w["mlp.down_proj.weight"])
    rotary = LlamaRotaryEmbedding(config)

    def layer(embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        n = embeds.shape[0]
        x = torch.cat([rms(w["input_layernorm.weight"])(embeds), rms(w["hidden_norm.weight"])(hidden)], -1)
        q = (x @ w["self_attn.q_proj.weight"].T).view(1, n, HEADS, HEAD_DIM).transpose(1, 2)
        k = (x @ w["self_attn.k_proj.weight"].T).view(1, n, 2, HEAD_DIM).transpose(1, 2)
        v = (x @ w["self_attn.v_proj.weight"].T).view(1, n, 2, HEAD_DIM).transpose(1, 2)
        cos, sin = rotary(x[None], torch.arange(n)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = q @ k.transpose(-1, -2) / HEAD_DIM**0.5
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, HEADS * HEAD_DIM)
        h = hidden + attn @ w["self_attn.o_proj.weight"].T
        return h + mlp(rms(w["post_attention_layernorm.weight"])(h))

    fused = aux @ w["fc.weight"].T
    first = layer(embed[tokens], fused)
    # The draft step: one more row whose hidden state is the last row's output (its K/V see rows 0..n).
    out = layer(embed[torch.cat([tokens, tokens[-1:]])], torch.cat([fused, first[-1:]]))
    logits = rms(w["norm.weight"])(out) @ w["lm_head.weight"].T
    return logits, out


def test_head_forward_equals_the_eagle3_layer_built_from_transformers(
    tmp_path: Path, target: ModelBundle
) -> None:
    tensors = random_head(seed=3)
    embed = 0.5 * torch.randn(MODEL_VOCAB, HIDDEN, generator=torch.Generator().manual_seed(4))
    tensors["embed_tokens.weight"] = embed
    head = Eagle3Head.load(write_head(tmp_path / "head", tensors))
    head.check_target(HIDDEN, MODEL_VOCAB, LAYERS, "tiny")
    head.to(torch.device("cpu"), torch.float32)
    n = 11
    gen = torch.Generator().manual_seed(5)
    aux = torch.randn(n, 3 * HIDDEN, generator=gen)
    tokens = torch.randint(0, MODEL_VOCAB, (n,), generator=gen)
    proposer = Eagle3Proposer(head, fp32_runner(target).model, MODEL_VOCAB)
    proposer.states["r"] = _State()
    with torch.inference_mode():
        first = proposer._pass(_Feed(["r"], [n], [torch.arange(n)], [tokens], [head.fuse(aux)]))["r"]
        second = proposer._pass(
            _Feed(["r"], [1], [torch.tensor([n])], [tokens[-1:]], [head.feedback(first[-1:])])
        )["r"]
        ours = head.logits(torch.cat([first, second]))
    expected_logits, expected_out = reference_logits(tensors, aux, tokens, embed)
    torch.testing.assert_close(torch.cat([first, second]), expected_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, expected_logits, atol=1e-5, rtol=1e-5)


def test_speculators_layout_reads_the_same_head(tmp_path: Path) -> None:
    tensors = random_head(seed=6)
    vllm = Eagle3Head.load(write_head(tmp_path / "a", tensors))
    spec = Eagle3Head.load(write_head(tmp_path / "b", tensors, speculators_layout=True))
    for name, tensor in vllm.weights.items():
        other = spec.weights[name]
        assert (tensor is None) == (other is None)
        if tensor is not None and other is not None:
            assert torch.equal(tensor, other), name


# -- constructed heads: known acceptance -------------------------------------------------------------


def greedy(n: int = 40) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)] * 4


def test_an_echo_head_on_a_memoryless_target_drafts_every_token(
    tmp_path: Path, memoryless_hf: torch.nn.Module
) -> None:
    target = bundle_from_hf(memoryless_hf)
    head = write_head(tmp_path / "echo", echo_head(memoryless_hf), kv_heads=HEADS, norm_before_residual=True)
    off = [summary(o) for o in run(make_engine(target, None), prompts()[:4], greedy())]
    engine = make_engine(target, head)
    on = [summary(o) for o in run(engine, prompts()[:4], greedy())]
    assert on == off
    assert engine.spec_accepted_tokens >= 0.98 * engine.spec_draft_tokens > 0
    assert engine.stats().tokens_per_target_pass > 4.0  # k = 4: five tokens per pass after the prompt


def test_a_permuted_draft_vocabulary_maps_back_through_d2t(
    tmp_path: Path, memoryless_hf: torch.nn.Module
) -> None:
    target = bundle_from_hf(memoryless_hf)
    permutation = torch.randperm(MODEL_VOCAB, generator=torch.Generator().manual_seed(9))
    tensors = echo_head(memoryless_hf, permutation)
    head = write_head(tmp_path / "perm", tensors, kv_heads=HEADS, norm_before_residual=True)
    engine = make_engine(target, head)
    run(engine, prompts()[:4], greedy())
    assert engine.spec_accepted_tokens >= 0.98 * engine.spec_draft_tokens > 0
    # Without d2t the same head proposes the draft ids as target ids: nearly all rejected.
    tensors.pop("d2t")
    wrong = make_engine(
        target, write_head(tmp_path / "nod2t", tensors, kv_heads=HEADS, norm_before_residual=True)
    )
    run(wrong, prompts()[:4], greedy())
    assert wrong.spec_accepted_tokens < 0.2 * wrong.spec_draft_tokens


def test_a_head_reading_only_the_target_rows_is_right_once_per_step(
    tmp_path: Path, memoryless_hf: torch.nn.Module
) -> None:
    """Layer input L of the memoryless target is its input embedding: a head whose output is fc(that)
    drafts f(x_p) = x_{p+1} at row p, one token early. Its first draft of a step is right only if fed
    the row before the last committed token's; its later drafts repeat the first."""
    target = bundle_from_hf(memoryless_hf)
    tensors = echo_head(memoryless_hf)
    tensors["fc.weight"] = torch.cat([torch.zeros(HIDDEN, 2 * HIDDEN), torch.eye(HIDDEN)], dim=1)
    tensors["midlayer.self_attn.o_proj.weight"] = torch.zeros(HIDDEN, HIDDEN)
    head = write_head(
        tmp_path / "rows",
        tensors,
        kv_heads=HEADS,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    )
    off = [summary(o) for o in run(make_engine(target, None), prompts()[:4], greedy())]
    engine = make_engine(target, head)
    proposer: Any = engine.scheduler.proposer
    seen: list[tuple[int, list[int]]] = []
    propose = proposer.propose

    def witness(wanted: list, live: set[str]) -> dict[str, list[int]]:
        drafts = propose(wanted, live)
        seen.extend((r.all_token_ids[-1], drafts[r.req_id]) for r, _ in wanted if r.req_id in drafts)
        return drafts

    proposer.propose = witness
    on = [summary(o) for o in run(engine, prompts()[:4], greedy())]
    assert on == off
    # Fed up to row c - 1 (token c embedded), draft 1 is f(x_{c-1}) = x_c, the last committed token,
    # and the later drafts repeat it (the head's own output carries the same state). Their number is
    # the sequence's adapted K (speculative.record_outcome: runs that keep little shrink it).
    assert len(seen) >= 8  # fewer than steps: all-rejected runs pause proposing
    assert all(drafts and drafts == [last] * len(drafts) for last, drafts in seen)


# -- exactness under batching --------------------------------------------------------------------------

PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=1.0, seed=7, max_tokens=60, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True),  # max_tokens inside a draft run
    SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=30, repetition_penalty=1.2),
] * 2


def test_greedy_and_seeded_outputs_match_plain_decoding_under_batching(
    tmp_path: Path, target_hf: torch.nn.Module
) -> None:
    # The echo head on a target whose context matters a little: some drafts kept, some rolled back.
    target_hf = damped(target_hf, DAMPING)
    target = bundle_from_hf(target_hf)
    head = write_head(tmp_path / "echo", echo_head(target_hf), kv_heads=HEADS, norm_before_residual=True)
    off_outs = run(make_engine(target, None), prompts(), PARAMS)
    engine = make_engine(target, head, max_batch=6)
    on_outs = run(engine, prompts(), PARAMS)
    assert [summary(o) for o in on_outs] == [summary(o) for o in off_outs]
    for on, off in zip(on_outs, off_outs, strict=True):
        assert logprob_values(on) == pytest.approx(logprob_values(off), abs=1e-3)
    assert 0 < engine.spec_accepted_tokens < engine.spec_draft_tokens
    stats = engine.stats()
    assert stats.speculative_method == "eagle"
    assert stats.tokens_per_target_pass > 1
    engine.step()
    proposer: Any = engine.scheduler.proposer
    assert not proposer.states  # every request ended: its head cache was freed


def test_a_random_head_keeps_output_exact(tmp_path: Path, target: ModelBundle) -> None:
    head = write_head(tmp_path / "rand", random_head(seed=11))
    off = [summary(o) for o in run(make_engine(target, None), prompts()[:4], greedy(30))]
    engine = make_engine(target, head)
    assert [summary(o) for o in run(engine, prompts()[:4], greedy(30))] == off
    assert engine.spec_draft_tokens > 0


# -- typed errors ------------------------------------------------------------------------------------


def test_a_head_for_another_target_is_refused_with_the_reason(tmp_path: Path, target: ModelBundle) -> None:
    runner = fp32_runner(target)
    wide = random_head()
    wide["fc.weight"] = torch.zeros(HIDDEN, 3 * 128)
    folder = write_head(tmp_path / "wide", wide, target_hidden_size=128)
    with pytest.raises(Eagle3LoadError, match="hidden states of size 128, tiny has 64"):
        runner.eagle3_proposer(str(folder), "tiny", MODEL_VOCAB)
    other = random_head()
    other["d2t"] = torch.zeros(MODEL_VOCAB, dtype=torch.long)
    other_vocab = write_head(tmp_path / "vocab", other, vocab_size=1000)
    with pytest.raises(Eagle3LoadError, match="vocabulary has 1000 tokens, tiny's 259"):
        runner.eagle3_proposer(str(other_vocab), "tiny", MODEL_VOCAB)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(Eagle3LoadError, match="not an EAGLE-3 head"):
        runner.eagle3_proposer(str(plain), "tiny", MODEL_VOCAB)
    assert runner.hidden_taps is None  # nothing attached after a refusal
