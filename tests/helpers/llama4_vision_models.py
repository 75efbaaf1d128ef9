"""A tiny random Llama4ForConditionalGeneration (transformers' own class: the Llama 4 text model, the
Llama 4 vision tower with its pixel-shuffle adapter, the projector) saved as a safetensors folder with a
word-level tokenizer holding Llama 4's image tokens, a Llama-4-style chat template and a
preprocessor_config.json at the tiny tower's size (32 px tiles, at most 6 per picture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Llama4Config, Llama4ForConditionalGeneration

PATCH_ID = 299  # <|patch|>: config.image_token_index
TILE, PATCH, MAX_TILES = 32, 4, 6  # an 8 x 8 patch grid per tile, pixel-shuffled to 4 x 4 = 16 tokens
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // 4
TEXT: dict[str, Any] = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "floor_scale": 4,
    "attn_scale": 0.5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "max_position_embeddings": 1024,
}
VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 128,  # the adapter's fc1 takes the shuffled rows: 4 x hidden
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": TILE,
    "patch_size": PATCH,
    "vision_output_dim": 48,
    "projector_input_dim": 48,
    "projector_output_dim": 48,
    "pixel_shuffle_ratio": 0.5,
}
SPECIALS = [
    "<unk>",
    "<|begin_of_text|>",
    "<|eot|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|image|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
]
WORDS = ["user", "assistant", "what", "is", "in", "this", "picture", "?"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|header_start|>{{ m['role'] }}<|header_end|> "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}{{ '<|image|>' }}{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|eot|> {% endfor %}"
    "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|> {% endif %}"
)
PREPROCESSOR = {
    "image_processor_type": "Llama4ImageProcessor",
    "size": {"height": TILE, "width": TILE},
    "max_patches": MAX_TILES,
    "resize_to_max_canvas": False,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "rescale_factor": 0.00392156862745098,
    "resample": 2,
}


def build() -> Llama4ForConditionalGeneration:
    torch.manual_seed(0)
    config = Llama4Config(text_config=TEXT, vision_config=VISION, image_token_index=PATCH_ID)
    hf = Llama4ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            norm = "norm" in name and name.endswith("weight")
            param.copy_((1.0 if norm else 0.0) + (0.2 if norm else 0.15) * torch.randn_like(param))
    return hf.eval()


def vocab() -> dict[str, int]:
    out = {token: i for i, token in enumerate(SPECIALS)}
    out.update({w: len(SPECIALS) + i for i, w in enumerate(WORDS)})
    out.update({f"w{i}": i for i in range(len(out), PATCH_ID)})
    out["<|patch|>"] = PATCH_ID
    return out


def write_folder(folder: Path) -> Llama4ForConditionalGeneration:
    hf = build()
    hf.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel(vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([*SPECIALS, "<|patch|>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": TEMPLATE,
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|eot|>",
                "unk_token": "<unk>",
            }
        )
    )
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "Llama4Processor", "patch_size": PATCH, "pixel_shuffle_ratio": 0.5})
    )
    return hf


def pictures(folder: Path) -> list[Path]:
    """Real files of three aspect ratios: a wide PNG (2 x 3 tiles), a tall JPEG (3 x 2) and a small square
    PNG (one tile, no global image)."""
    rng = np.random.default_rng(1)
    out = []
    for name, shape in (("wide.png", (50, 90, 3)), ("tall.jpg", (95, 61, 3)), ("small.png", (20, 24, 3))):
        smooth = Image.fromarray(rng.integers(0, 256, (shape[0] // 3, shape[1] // 3, 3), dtype=np.uint8))
        path = folder / name
        smooth.resize((shape[1], shape[0]), Image.Resampling.BICUBIC).save(path, quality=90)
        out.append(path)
    return out
