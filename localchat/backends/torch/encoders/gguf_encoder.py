"""Encoders from GGUF files in the layout llama.cpp's convert_hf_to_gguf.py writes for `bert` and
`nomic-bert`: the metadata becomes the config the safetensors encoders read, the tensors are
dequantized to float32 and renamed to the checkpoint names, and the same BertEncoder / NomicBertEncoder
run them. The pooling comes from `{arch}.pooling_type` (llama.cpp's enum)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from localchat.embeddings.st_config import SentenceConfig
from localchat.errors import ModelLoadError, UnsupportedArchitectureError

GGUF_ENCODER_ARCHES = ("bert", "nomic-bert")
# llama.cpp's LLAMA_POOLING_TYPE: 0 none, 1 mean, 2 cls, 3 last, 4 rank (a reranker head).
_POOLING = {1: "mean", 2: "cls", 3: "lasttoken"}

_BERT_GLOBAL = {
    "token_embd": "embeddings.word_embeddings",
    "token_types": "embeddings.token_type_embeddings",
    "position_embd": "embeddings.position_embeddings",
    "token_embd_norm": "embeddings.LayerNorm",
}
_BERT_BLOCK = {
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}
_NOMIC_BLOCK = {
    "attn_qkv": "attn.Wqkv",  # split into q/k/v by the nomic encoder
    "attn_output": "self_attn.o_proj",
    "attn_output_norm": "post_attention_layernorm",
    "ffn_up": "mlp.up_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_down": "mlp.down_proj",
    "layer_output_norm": "post_mlp_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def checkpoint_name(gguf_name: str, arch: str) -> str:
    if match := _BLOCK_RE.fullmatch(gguf_name):
        layer, part, kind = match.groups()
        names, prefix = (_BERT_BLOCK, "encoder.layer.") if arch == "bert" else (_NOMIC_BLOCK, "layers.")
        if part in names:
            return f"{prefix}{layer}.{names[part]}.{kind}"
    else:
        stem, _, kind = gguf_name.rpartition(".")
        if stem in _BERT_GLOBAL:
            return f"{_BERT_GLOBAL[stem]}.{kind}"
    raise ModelLoadError(
        f"GGUF tensor {gguf_name!r} is not part of a {arch} embedding model (rerank heads in GGUF are "
        "not supported); the file may be damaged."
    )


def _tensors(reader: Any, arch: str) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
        try:
            data = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        except (ValueError, NotImplementedError) as exc:
            raise ModelLoadError(f"GGUF tensor {tensor.name} cannot be read ({exc}).") from exc
        out[checkpoint_name(tensor.name, arch)] = torch.from_numpy(data.copy())
    return out


def gguf_encoder_config(reader: Any) -> tuple[dict[str, Any], str, str | None]:
    """(config in transformers' keys, llama.cpp architecture, pooling mode or None for none/rank)."""
    from localchat.weights.gguf import gguf_value

    arch = str(gguf_value(reader, "general.architecture", ""))
    if arch not in GGUF_ENCODER_ARCHES:
        raise UnsupportedArchitectureError(arch, list(GGUF_ENCODER_ARCHES))

    def meta(key: str, default: Any = None) -> Any:
        return gguf_value(reader, f"{arch}.{key}", default)

    config: dict[str, Any] = {
        "model_type": "bert" if arch == "bert" else "nomic_bert",
        "hidden_size": int(meta("embedding_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": int(meta("attention.head_count")),
        "intermediate_size": int(meta("feed_forward_length", 0)),
        "max_position_embeddings": int(meta("context_length", 512)),
        "layer_norm_eps": float(str(np.float32(meta("attention.layer_norm_epsilon", 1e-12)))),
        "pad_token_id": int(gguf_value(reader, "tokenizer.ggml.padding_token_id", 0) or 0),
        "hidden_act": "gelu" if arch == "bert" else "swiglu",
    }
    if arch == "nomic-bert":
        config["rotary_emb_base"] = float(meta("rope.freq_base", 1000.0))
    pooling = _POOLING.get(int(meta("pooling_type", 0) or 0))
    return config, arch, pooling


def load_gguf_encoder(path: Path, normalize: bool = True) -> tuple[Any, SentenceConfig]:
    """The encoder in a GGUF file. GGUF keeps no sentence-transformers settings beyond the pooling, so
    vectors are L2-normalised (what llama.cpp's server returns and every catalogued model wants)."""
    from localchat.backends.torch.encoders.bert import BertEncoder
    from localchat.backends.torch.encoders.nomic_bert import NomicBertEncoder
    from localchat.backends.torch.encoders.pooling import DenseStack
    from localchat.weights.gguf import open_gguf

    reader = open_gguf(path)
    config, arch, pooling = gguf_encoder_config(reader)
    if pooling is None:
        raise ModelLoadError(
            f"{path.name} has no sentence pooling (pooling_type none or rank): it is not an embedding model."
        )
    sentence = SentenceConfig(pooling=pooling, normalize=normalize)
    tensors = _tensors(reader, arch)
    if arch == "bert":
        return BertEncoder(config, tensors, sentence, DenseStack(())), sentence
    return NomicBertEncoder(config, tensors, sentence, DenseStack(())), sentence
