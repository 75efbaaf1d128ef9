"""Write a tiny llama-family model as a GGUF file, the way llama.cpp's converter would.

    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    # From a transformers model (any llama/mistral/qwen2/qwen3); parity tests compare its logits.
    config = LlamaConfig(vocab_size=TINY_VOCAB_SIZE, hidden_size=256, ...)
    model = LlamaForCausalLM(config)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", model, qtype="Q4_0", tokenizer_kind="llama")

    # Without torch: a config dict and random numpy weights under HF names.
    cfg = tiny_config("qwen3")
    path = write_tiny_gguf(tmp_path / "q3.gguf", random_state_dict(cfg), cfg, qtype="Q6_K")

- Weights: 2-D tensors are stored as `qtype` ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
  "Q5_1", "Q4_K", "Q5_K", "Q6_K"); a tensor whose row length is not a multiple of the type's block
  (32, or 256 for *_K) falls back to F32, and 1-D tensors (norms, biases) are always F32, as llama.cpp
  keeps them. For llama/mistral the q/k rows are permuted like the converter does.
- `lm_head.weight` is left out when the config ties embeddings (the loader must then report tied).
- Tokenizer: "gpt2" = a byte-level BPE vocabulary with merges (trained here on a small built-in text,
  ChatML control tokens, two user-defined tokens) tagged with `pre`; "llama" = a SentencePiece BPE model
  with byte fallback (trained here with the sentencepiece library; `tiny_spm()` returns the processor,
  so tests can compare against real SentencePiece). Either is padded with [PAD{i}] tokens up to the
  config's vocab_size, which must be at least TINY_VOCAB_SIZE.
- Llama 3 rope scaling in the config is written as a `rope_freqs.weight` tensor, as llama.cpp does;
  yarn as `rope.scaling.*` metadata (Ministral 3's q temperature beta as `attention.temperature_scale`).
- Mixture of experts (qwen3_moe, mixtral from transformers 5's stacked `mlp.experts.gate_up_proj` /
  `down_proj`): written as llama.cpp's 3-D `ffn_{gate,up,down}_exps` in `qtype`, the router
  `ffn_gate_inp` kept F32 (llama-quantize never quantizes it), with `{arch}.expert_count` etc.
  `legacy_experts=True` writes one tensor per expert instead (`blk.N.ffn_gate.E.weight`), as Mixtral
  files converted before llama.cpp stacked them (early 2024) do.
- DeepSeek (deepseek_v2 / deepseek_v3 -> llama.cpp's "deepseek2"): its MLA metadata as the converter writes
  it (head_count_kv 1, key/value_length of the latent, *_mla of the heads; yarn_log_multiplier
  0.1 * mscale_all_dim), kv_b_proj split into `attn_k_b` (transposed) and `attn_v_b` as current
  llama.cpp writes it, or kept as one `attn_kv_b` with `legacy_kv_b=True` (files before its MLA rework,
  which also wrote the head sizes in key/value_length), shared experts as `ffn_*_shexp`, V3's router bias
  as `exp_probs_b.bias`.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    ExpertGatingFuncType,
    GGMLQuantizationType,
    GGUFWriter,
    RopeScalingType,
    TokenType,
)
from gguf.quants import quantize

from tests.helpers.iquants import IQ_QUANTIZERS
from tests.helpers.kquants import K_QUANTIZERS
from tests.helpers.lowbit import LOWBIT_QUANTIZERS

TINY_VOCAB_SIZE = 512
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# llama.cpp writes Mixtral as "llama" with expert tensors and an expert count.
_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "qwen3_moe": "qwen3moe",
    "mixtral": "llama",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "ministral3": "mistral3",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",
    "smollm3": "smollm3",
}
# Converted with llama.cpp's Llama script, which permutes q/k rows.
_PERMUTED = ("llama", "mistral", "mixtral", "ministral3", "smollm3")
GPT2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<think>", "</think>"]

_TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs away.
Hello world! Hello there, my friend. How are you today? I'm fine, thanks; we're all doing well.
It's a small model for tests: it learns nothing, but its tokenizer must split text the right way.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, 2))
class Point:
\tdef __init__(self, x: int, y: int) -> None:
\t\tself.x = x
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 -7 1,000,000
Café déjà vu, naïve façade; Über straße. ¿Qué tal? Ça va.
日本語のテキストです。東京は大きい。中文文本。
Привет, мир! Как дела?
مرحبا بالعالم
Emoji: 😀 🎉 👍
"""


def _lines() -> list[str]:
    return [line for line in _TRAINING_TEXT.splitlines() if line] * 4


@cache
def tiny_gpt2_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a small byte-level BPE vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE - 2 * len(USER_DEFINED) - 32,
        special_tokens=GPT2_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_lines(), trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [TokenType.CONTROL if t in GPT2_SPECIALS else TokenType.NORMAL for t in tokens]
    tokens += USER_DEFINED
    types += [TokenType.USER_DEFINED] * len(USER_DEFINED)
    return tokens, [int(t) for t in types], merges


@cache
def tiny_spm() -> Any:
    """A trained SentencePiece BPE processor (byte fallback, ChatML control symbols, Llama 2 options)."""
    import sentencepiece as spm

    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_lines()),
        model_writer=proto,
        model_type="bpe",
        vocab_size=TINY_VOCAB_SIZE - 64,
        byte_fallback=True,
        character_coverage=1.0,
        control_symbols=["<|im_start|>", "<|im_end|>"],
        # Llama 2's settings: text kept as is (no NFKC, no whitespace squeezing), digits split.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=proto.getvalue())


def tiny_spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """(pieces, token types, scores) of `tiny_spm()`, as llama.cpp's converter writes them."""
    sp = tiny_spm()
    tokens, types, scores = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        if sp.is_unknown(i):
            types.append(TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(TokenType.BYTE)
        elif sp.is_unused(i):
            types.append(TokenType.UNUSED)
        else:
            types.append(TokenType.NORMAL)
    return tokens, [int(t) for t in types], scores


def tiny_config(model_type: str = "llama", **overrides: Any) -> dict[str, Any]:
    """A config.json-style dict for a tiny model; hidden 256 so every K-quant block fits a row."""
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "vocab_size": TINY_VOCAB_SIZE,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
    }
    cfg.update(overrides)
    return cfg


def random_state_dict(cfg: Mapping[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights for `cfg` (llama/mistral/qwen2/qwen3), std 0.02 like an initialized model."""
    rng = np.random.default_rng(seed)
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    bias = cfg.get("attention_bias", cfg["model_type"] == "qwen2")
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        for proj, rows in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
            shapes[f"{p}self_attn.{proj}_proj.weight"] = (rows, hidden)
            if bias:
                shapes[f"{p}self_attn.{proj}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if cfg["model_type"] == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (head_dim,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (cfg["vocab_size"], hidden)

    def init(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if len(shape) == 1 and "norm" in name:
            return 1.0 + 0.1 * rng.standard_normal(shape)  # norms sit around 1
        return 0.02 * rng.standard_normal(shape)

    return {name: init(name, shape).astype(np.float32) for name, shape in shapes.items()}


def write_tiny_gguf(
    path: str | Path,
    hf_model_or_state_dict: Any,
    config: Any = None,
    qtype: str = "Q8_0",
    tokenizer_kind: str = "gpt2",
    *,
    pre: str = "smollm",
    chat_template: str | None = CHATML_TEMPLATE,
    add_bos: bool | None = None,
    add_space_prefix: bool | None = None,
    architecture: str | None = None,
    legacy_experts: bool = False,
    legacy_kv_b: bool = False,
) -> Path:
    """Write `hf_model_or_state_dict` (a transformers model, or {HF name: tensor/array}) as GGUF.

    `config`: a transformers config or its dict (defaults to the model's). `add_bos` / `add_space_prefix`:
    written only when not None. `architecture` overrides general.architecture (for error tests).
    Returns `path`.
    """
    path = Path(path)
    cfg = _config_dict(hf_model_or_state_dict if config is None else config)
    source = hf_model_or_state_dict
    state = source.state_dict() if hasattr(source, "state_dict") else source
    model_type = cfg["model_type"]
    arch = architecture or _ARCHITECTURES[model_type]
    writer = GGUFWriter(path, arch)  # writes general.architecture itself
    writer.add_name("tiny-test-model")
    _write_hparams(writer, cfg)
    if model_type.startswith("deepseek"):
        _write_deepseek_hparams(writer, cfg, legacy_kv_b)
    _write_tokenizer(writer, cfg, tokenizer_kind, pre, chat_template, add_bos, add_space_prefix)
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    for name, tensor in state.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        data = _to_numpy(tensor)
        if model_type in _PERMUTED and ".self_attn.q_proj." in name:
            data = _permute(data, heads)
        elif model_type in _PERMUTED and ".self_attn.k_proj." in name:
            data = _permute(data, kv_heads)
        if name.endswith(".mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
            gate, up = np.split(data, 2, axis=1)
            block = name.removesuffix("mlp.experts.gate_up_proj").replace("model.layers.", "blk.")
            _add_experts(writer, f"{block}ffn_gate", gate, qtype, legacy_experts)
            _add_experts(writer, f"{block}ffn_up", up, qtype, legacy_experts)
            continue
        if name.endswith(".mlp.experts.down_proj"):
            block = name.removesuffix("mlp.experts.down_proj").replace("model.layers.", "blk.")
            _add_experts(writer, f"{block}ffn_down", data, qtype, legacy_experts)
            continue
        if name.endswith(".self_attn.kv_b_proj.weight") and not legacy_kv_b:
            _add_split_kv_b(writer, name, data, cfg, qtype)
            continue
        if name.endswith(".mlp.gate.e_score_correction_bias"):
            writer.add_tensor(
                name.replace("model.layers.", "blk.").replace(
                    "mlp.gate.e_score_correction_bias", "exp_probs_b.bias"
                ),
                data,
            )
            continue
        if model_type.startswith("gemma") and name.endswith("norm.weight"):
            data = data + 1.0  # llama.cpp's converter stores Gemma's RMSNorm scale as 1 + weight
        gguf_name = _gguf_name(name, model_type)
        _add_tensor(writer, gguf_name, data, "F32" if "ffn_gate_inp" in gguf_name else qtype)
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    scaling = scaling.get("full_attention") or scaling  # per layer type (Gemma 3): the global layers'
    if scaling.get("rope_type") == "linear":  # Gemma 3 4B+: llama.cpp scales the global layers only
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    if scaling.get("rope_type") == "llama3":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        writer.add_tensor("rope_freqs.weight", _llama3_factors(scaling, _rope_theta(cfg), head_dim))
    if scaling.get("rope_type") == "longrope":  # phi3: the lists as tensors, the lengths as metadata
        writer.add_tensor("rope_factors_long.weight", np.asarray(scaling["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(scaling["short_factor"], dtype=np.float32))
        original = int(scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_orig_ctx_len(original)
        factor = cfg["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(factor) / math.log(original)))
    if scaling.get("rope_type") == "yarn":
        deepseek = model_type.startswith("deepseek")
        _write_yarn(writer, {**scaling, "mscale_all_dim": None} if deepseek else scaling)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_yarn(writer: GGUFWriter, scaling: Mapping[str, Any]) -> None:
    """Yarn as llama.cpp's converter writes it; Ministral 3's q temperature beta as attention metadata."""
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(float(scaling["factor"]))
    writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
    for key, add in (
        ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
        ("beta_slow", writer.add_rope_scaling_yarn_beta_slow),
        ("mscale_all_dim", writer.add_rope_scaling_yarn_log_mul),
        ("llama_4_scaling_beta", writer.add_attn_temperature_scale),
    ):
        if scaling.get(key) is not None:
            add(float(scaling[key]))


def _config_dict(source: Any) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return dict(source)
    if hasattr(source, "config"):
        source = source.config
    return source.to_dict()


def _rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    params = params.get("full_attention") or params  # per layer type (Gemma 3): the global layers'
    return float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _write_hparams(writer: GGUFWriter, cfg: dict[str, Any]) -> None:
    heads = cfg["num_attention_heads"]
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_context_length(cfg.get("max_position_embeddings", 2048))
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    if not cfg["model_type"].startswith("deepseek"):  # its head sizes: _write_deepseek_hparams
        writer.add_head_count_kv(cfg.get("num_key_value_heads") or heads)
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        partial = cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get(
            "partial_rotary_factor", 1.0
        )
        writer.add_rope_dimension_count(int(head_dim * partial))
    writer.add_rope_freq_base(_rope_theta(cfg))
    writer.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    writer.add_file_type(0)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        if cfg.get("moe_intermediate_size"):
            writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("sliding_window"):
        writer.add_sliding_window(cfg["sliding_window"])
    if cfg.get("attn_logit_softcapping"):
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    if cfg.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    swa_theta = ((cfg.get("rope_parameters") or {}).get("sliding_attention") or {}).get("rope_theta")
    if swa_theta is not None:
        writer.add_rope_freq_base_swa(float(swa_theta))


def _write_deepseek_hparams(writer: GGUFWriter, cfg: dict[str, Any], legacy_kv_b: bool) -> None:
    """DeepSeek's MLA and MoE metadata, as llama.cpp's DeepseekV2Model converter writes them."""
    rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    qk, v = cfg["qk_nope_head_dim"] + rope, cfg["v_head_dim"]
    if legacy_kv_b:  # before llama.cpp's MLA rework: the heads' sizes, one cache head per query head
        writer.add_head_count_kv(cfg["num_attention_heads"])
        writer.add_key_length(qk)
        writer.add_value_length(v)
    else:  # MQA over the latent; the heads' sizes in *_mla
        writer.add_head_count_kv(1)
        writer.add_key_length(rank + rope)
        writer.add_value_length(rank)
        writer.add_key_length_mla(qk)
        writer.add_value_length_mla(v)
    writer.add_rope_dimension_count(rope)
    writer.add_kv_lora_rank(rank)
    if cfg.get("q_lora_rank"):
        writer.add_q_lora_rank(cfg["q_lora_rank"])
    writer.add_leading_dense_block_count(cfg.get("first_k_dense_replace") or 0)
    writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    writer.add_expert_count(cfg["n_routed_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    writer.add_expert_shared_count(cfg.get("n_shared_experts") or 0)
    writer.add_expert_weights_scale(float(cfg.get("routed_scaling_factor") or 1.0))
    if cfg.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    sigmoid = cfg["model_type"] == "deepseek_v3"
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID if sigmoid else ExpertGatingFuncType.SOFTMAX)
    if (cfg.get("n_group") or 1) > 1 and cfg.get("topk_method") != "greedy":
        writer.add_expert_group_count(cfg["n_group"])
        writer.add_expert_group_used_count(cfg["topk_group"])
    scaling = cfg.get("rope_parameters") or {}
    if scaling.get("rope_type") == "yarn" and scaling.get("mscale_all_dim"):
        writer.add_rope_scaling_yarn_log_mul(0.1 * float(scaling["mscale_all_dim"]))


def _add_split_kv_b(writer: GGUFWriter, name: str, data: np.ndarray, cfg: dict[str, Any], qtype: str) -> None:
    """kv_b_proj [heads * (nope + v), rank] -> attn_k_b [heads, rank, nope] + attn_v_b [heads, v, rank]."""
    heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    kv_b = data.reshape(heads, nope + v, -1)
    block = name.removesuffix("self_attn.kv_b_proj.weight").replace("model.layers.", "blk.")
    _add_tensor(
        writer, f"{block}attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)), qtype
    )
    _add_tensor(writer, f"{block}attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:]), qtype)


def _write_tokenizer(
    writer: GGUFWriter,
    cfg: dict[str, Any],
    kind: str,
    pre: str,
    chat_template: str | None,
    add_bos: bool | None,
    add_space_prefix: bool | None,
) -> None:
    if kind == "gpt2":
        tokens, types, merges = tiny_gpt2_vocab()
        tokens, types = list(tokens), list(types)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_merges(merges)
        # Like SmolLM2: BOS <|im_start|>, EOS <|im_end|>, UNK <|endoftext|>.
        bos, eos, unk = (tokens.index(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
        scores = None
    elif kind == "llama":
        tokens, types, scores = tiny_spm_vocab()
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        bos, eos, unk = tokens.index("<s>"), tokens.index("</s>"), tokens.index("<unk>")
    else:
        raise ValueError(f"tokenizer_kind must be 'gpt2' or 'llama', not {kind!r}")
    if cfg["vocab_size"] < len(tokens):
        raise ValueError(
            f"vocab_size {cfg['vocab_size']} is smaller than the tiny vocabulary ({len(tokens)})"
        )
    padding = cfg["vocab_size"] - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), cfg["vocab_size"])]
    types += [int(TokenType.UNUSED)] * padding
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores([*scores, *([-1e9] * padding)])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_unk_token_id(unk)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "self_attn.qkv_proj": "attn_qkv",  # phi3: fused as in the HF checkpoint
    "mlp.gate_up_proj": "ffn_up",  # phi3: llama.cpp's ffn_up holds gate|up
    # DeepSeek's MLA and shared experts
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


# Gemma's four norms per layer, named as llama.cpp's gemma2/gemma3 archs name them.
_GEMMA_BLOCK = {
    **_BLOCK,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def _gguf_name(hf_name: str, model_type: str = "llama") -> str:
    stem, kind = hf_name.rsplit(".", 1)
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{kind}"
    parts = stem.split(".", 3)  # model, layers, N, the layer's own part
    block = _GEMMA_BLOCK if model_type.startswith("gemma") else _BLOCK
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in block:
        return f"blk.{parts[2]}.{block[parts[3]]}.{kind}"
    raise ValueError(f"No GGUF name for {hf_name}")


def _permute(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter: within each head, rows (i, i + d/2) become neighbours (2i, 2i + 1)."""
    half = weights.shape[0] // n_heads // 2
    # [heads, 2, half, ...] -> [heads, half, 2, ...]
    return weights.reshape(n_heads, 2, half, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _to_numpy(tensor: Any) -> np.ndarray:
    if hasattr(tensor, "detach"):  # a torch tensor
        tensor = tensor.detach().float().cpu().numpy()
    return np.ascontiguousarray(np.asarray(tensor, dtype=np.float32))


def _add_tensor(writer: GGUFWriter, name: str, data: np.ndarray, qtype: str) -> None:
    if data.ndim < 2 or qtype == "F32":
        writer.add_tensor(name, data)
        return
    if qtype == "F16":
        writer.add_tensor(name, data.astype(np.float16))
        return
    gtype = GGMLQuantizationType[qtype]
    if data.shape[-1] % GGML_QUANT_SIZES[gtype][0] != 0:
        writer.add_tensor(name, data)  # a row that does not fill whole blocks stays F32
        return
    encoders = {**K_QUANTIZERS, **IQ_QUANTIZERS, **LOWBIT_QUANTIZERS}  # the types gguf.quants cannot quantize
    blocks = encoders[qtype](data) if qtype in encoders else quantize(data, gtype)
    writer.add_tensor(name, blocks, raw_dtype=gtype)


def _add_experts(writer: GGUFWriter, stem: str, data: np.ndarray, qtype: str, legacy: bool) -> None:
    """[experts, out, in] as one `{stem}_exps` tensor, or (legacy) one `{stem}.E` tensor per expert."""
    if not legacy:
        _add_tensor(writer, f"{stem}_exps.weight", np.ascontiguousarray(data), qtype)
        return
    for e in range(data.shape[0]):
        _add_tensor(writer, f"{stem}.{e}.weight", np.ascontiguousarray(data[e]), qtype)


def _llama3_factors(scaling: dict[str, Any], theta: float, head_dim: int) -> np.ndarray:
    """The converter's per-frequency wavelength multipliers for Llama 3.1 rope scaling."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < context / high:
            out.append(1.0)
        elif wavelen > context / low:
            out.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)
