"""Tiny random Qwen2.5-VL and Qwen3-VL checkpoints (transformers' own classes) saved as safetensors folders,
with a word-level tokenizer and a preprocessor_config.json, for the vision parity and e2e tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

IMAGE, VIDEO, START, END = 290, 291, 292, 293
SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
VISION_SPECIALS = {
    "<|image_pad|>": IMAGE,
    "<|video_pad|>": VIDEO,
    "<|vision_start|>": START,
    "<|vision_end|>": END,
}
WORDS = ["user", "assistant", "what", "is", "in", "this", "picture", "?"]
# ChatML with Qwen's image marker, in a few lines.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p['text'] }} {% endif %}"
    "{% endfor %}{% endif %}<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 120 * 120
TEXT: dict[str, Any] = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "bos_token_id": None,
    "eos_token_id": 0,
}
VISION: dict[str, Any] = {
    "depth": 4,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
# Qwen3.5's hybrid text model (gated DeltaNet + full attention every 2nd layer), M-RoPE on half of head_dim.
QWEN3_5_TEXT: dict[str, Any] = {
    **TEXT,
    "num_hidden_layers": 4,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
}


def patch_size(kind: str) -> int:
    return 14 if kind in ("qwen2_vl", "qwen2_5_vl") else 16


def image_processor(kind: str) -> Qwen2VLImageProcessorPil:
    mean = None if kind in ("qwen2_vl", "qwen2_5_vl") else [0.5, 0.5, 0.5]
    extra = {} if mean is None else {"image_mean": mean, "image_std": mean}
    return Qwen2VLImageProcessorPil(
        patch_size=patch_size(kind), size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}, **extra
    )


def build(kind: str) -> Any:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    torch.manual_seed(0)
    ids: dict[str, Any] = {
        "image_token_id": IMAGE,
        "video_token_id": VIDEO,
        "vision_start_token_id": START,
        "vision_end_token_id": END,
    }
    config: Any
    hf: Any
    vision: dict[str, Any]
    rope: dict[str, Any]
    if kind == "qwen2_vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

        rope = {"rope_type": "default", "type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
        vision = {"depth": 3, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2}
        config = Qwen2VLConfig(text_config={**TEXT, "rope_parameters": rope}, vision_config=vision, **ids)
        hf = Qwen2VLForConditionalGeneration(config)
    elif kind == "qwen2_5_vl":
        rope = {"rope_type": "default", "type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
        vision = {**VISION, "patch_size": 14, "window_size": 56, "fullatt_block_indexes": [1, 3]}
        config = Qwen2_5_VLConfig(text_config={**TEXT, "rope_parameters": rope}, vision_config=vision, **ids)
        hf = Qwen2_5_VLForConditionalGeneration(config)
    elif kind == "qwen3_5":
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        vision = {**VISION, "patch_size": 16, "num_position_embeddings": 36}
        config = Qwen3_5Config(text_config=QWEN3_5_TEXT, vision_config=vision, **ids)
        hf = Qwen3_5ForConditionalGeneration(config)
    elif kind == "qwen3_5_moe":  # not in KINDS: one engine test
        from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        vision = {**VISION, "patch_size": 16, "num_position_embeddings": 36}
        moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
        text = {**QWEN3_5_TEXT, **moe, "shared_expert_intermediate_size": 32}
        config = Qwen3_5MoeConfig(text_config=text, vision_config=vision, **ids)
        hf = Qwen3_5MoeForConditionalGeneration(config)
    else:
        rope = {
            "rope_type": "default",
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
            "rope_theta": 10000.0,
        }
        text = {**TEXT, "head_dim": 16, "rope_parameters": rope}
        vision = {
            **VISION,
            "patch_size": 16,
            "num_position_embeddings": 36,
            "deepstack_visual_indexes": [0, 2],
        }
        config = Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
        hf = Qwen3VLForConditionalGeneration(config)
    with torch.no_grad():  # weights large enough that the picture moves the logits
        for name, param in hf.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue  # transformers' init: decays spread over (0.01, 16)
            if (
                kind == "qwen3_5"
                and name.endswith("norm.weight")
                and ".visual." not in name
                and "linear_attn" not in name
            ):
                param.copy_(0.1 * torch.randn_like(param))  # Qwen3.5's text norms are (1 + weight)
            elif name.endswith("norm.weight") or name.endswith("ln_q.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    return hf.eval()


def tokenizer() -> Tokenizer:
    vocab = {**SPECIALS, **{w: 3 + i for i, w in enumerate(WORDS)}}
    vocab |= {f"w{i}": i for i in range(3 + len(WORDS), IMAGE)} | VISION_SPECIALS
    vocab |= {f"x{i}": i for i in range(END + 1, TEXT["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([*SPECIALS, *VISION_SPECIALS])
    return tok


def write_folder(kind: str, folder: Path) -> Any:
    hf = build(kind)
    hf.save_pretrained(folder)
    tokenizer().save(str(folder / "tokenizer.json"))
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, **special}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    image_processor(kind).save_pretrained(folder)
    return hf


def pictures(folder: Path) -> list[Path]:
    """A PNG and a JPEG of odd sizes (resized to different grids)."""
    rng = np.random.default_rng(1)
    paths = []
    for i, (shape, fmt) in enumerate((((70, 100, 3), "png"), ((90, 47, 3), "jpeg"))):
        path = folder / f"picture{i}.{fmt}"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "RGB").save(path)
        paths.append(path)
    return paths
