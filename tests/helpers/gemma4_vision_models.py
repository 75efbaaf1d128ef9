"""A tiny random Gemma4ForConditionalGeneration (text LM + vision tower + embedder, no audio) saved as a
safetensors folder with a word-level tokenizer that knows Gemma 4's image tokens, a Gemma-style chat
template writing `<|image|>` per picture, and transformers' own Gemma 4 image processor config (patch 4,
kernel 3, 70 soft tokens at most: pictures of ~100 x 100 px)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Gemma4Config, Gemma4ForConditionalGeneration
from transformers.models.gemma4 import Gemma4ImageProcessorPil

from tests.helpers.torch_models import tiny_hf_model

# The text LM of tests/backends/test_gemma4.py (sliding and global layers of different head sizes,
# soft-capped logits), with a window that covers a picture's run.
TEXT: dict[str, Any] = {
    "num_hidden_layers": 4,
    "head_dim": 16,
    "global_head_dim": 32,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "final_logit_softcapping": 5.0,
    "hidden_size_per_layer_input": 0,
}
# E2B / E4B's per-layer embeddings: image rows take the pad token's.
TEXT_PLE: dict[str, Any] = {**TEXT, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 256}
# Clipped linears and standardized features (the real towers' options) so their buffers are exercised.
VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": 4,
    "pooling_kernel_size": 3,
    "position_embedding_size": 64,
    "use_clipped_linears": True,
    "standardize": True,
}
PROCESSOR: dict[str, Any] = {"patch_size": 4, "max_soft_tokens": 70, "pooling_kernel_size": 3}
SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
IMAGE_SPECIALS = {"<|image>": 251, "<image|>": 252, "<|image|>": 250}
WORDS = ["user", "model", "what", "is", "in", "this", "picture", "?"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|image|>{% else %}{{ p['text'] }} {% endif %}{% endfor %}{% endif %}"
    "<end_of_turn> {% endfor %}{% if add_generation_prompt %}<start_of_turn>model {% endif %}"
)


def image_processor() -> Gemma4ImageProcessorPil:
    return Gemma4ImageProcessorPil(**PROCESSOR)


def tokenizer() -> Tokenizer:
    vocab = {**SPECIALS, **{w: 5 + i for i, w in enumerate(WORDS)}}
    vocab |= {f"w{i}": i for i in range(5 + len(WORDS), 250)} | IMAGE_SPECIALS
    vocab |= {f"w{i}": i for i in range(253, 256)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([*SPECIALS, *IMAGE_SPECIALS])
    return tok


def write_folder(folder: Path, text: dict[str, Any] | None = None) -> Any:
    """Saves the checkpoint, tokenizer, template and processor config; returns transformers' model."""
    text_model: Any = tiny_hf_model("gemma4_text", **(text or TEXT))
    text_config = text_model.config.to_dict()
    torch.manual_seed(0)
    config = Gemma4Config(
        text_config=text_config,
        vision_config=VISION,
        audio_config=None,
        image_token_id=IMAGE_SPECIALS["<|image|>"],
        boi_token_id=IMAGE_SPECIALS["<|image>"],
        eoi_token_id=IMAGE_SPECIALS["<image|>"],
    )
    hf = Gemma4ForConditionalGeneration(config)
    with torch.no_grad():  # wide enough weights that the picture moves the logits; norms around 1
        for name, param in hf.named_parameters():
            norm = name.endswith("norm.weight")
            param.copy_((1.0 if norm else 0.0) + (0.2 if norm else 0.15) * torch.randn_like(param))
        for name, buffer in hf.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(0.5 + torch.rand_like(buffer))
            elif name.endswith(("input_max", "output_max")):  # clamps that bite on some values
                buffer.fill_(1.5)
            elif name.endswith(("input_min", "output_min")):
                buffer.fill_(-1.5)
            elif name.endswith("std_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
            elif name.endswith("std_scale"):
                buffer.copy_(0.5 + torch.rand_like(buffer))
    hf.eval().save_pretrained(folder)
    tokenizer().save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, **special}))
    image_processor().save_pretrained(folder)
    return hf


def pictures(folder: Path) -> list[Path]:
    """A PNG, a wide JPEG and a transparent PNG, all random noise, written to real files."""
    rng = np.random.default_rng(1)
    paths = []
    specs = (((90, 120, 3), "RGB", "png"), ((37, 150, 3), "RGB", "jpeg"), ((64, 48, 4), "RGBA", "png"))
    for i, (shape, mode, fmt) in enumerate(specs):
        path = folder / f"picture{i}.{fmt}"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(path)
        paths.append(path)
    return paths
