"""A tiny random LlavaForConditionalGeneration (transformers' own class: a Llama text model and a
CLIPVisionModel tower) saved as a safetensors folder with a word-level tokenizer, a Vicuna-style chat
template and LLaVA 1.5's preprocessor_config.json (at the tiny tower's size), for the LLaVA parity, GGUF
and e2e tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlavaConfig, LlavaForConditionalGeneration

IMAGE = 299
IMAGE_SIZE, PATCH = 56, 14
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH) ** 2  # "default" strategy: the CLS row is dropped
TEXT: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "max_position_embeddings": 256,
}
VISION: dict[str, Any] = {
    "model_type": "clip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH,
    "projection_dim": 16,
}
SPECIALS = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": IMAGE}
WORDS = ["USER:", "ASSISTANT:", "what", "is", "in", "this", "picture", "?"]
# Vicuna's layout, as llava-hf's templates write it: the picture's <image> before the text.
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>\n{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    " {% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
PREPROCESSOR = {
    "image_processor_type": "CLIPImageProcessor",
    "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": IMAGE_SIZE},
}


def build(**config: Any) -> LlavaForConditionalGeneration:
    torch.manual_seed(0)
    hf = LlavaForConditionalGeneration(
        LlavaConfig(text_config=TEXT, vision_config=VISION, image_token_index=IMAGE, **config)
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            scale = 0.3 if "norm" in name else 0.15
            param.copy_(
                (1.0 if name.endswith(("norm.weight", "layrnorm.weight")) else 0.0)
                + scale * torch.randn_like(param)
            )
    return hf.eval()


def write_folder(folder: Path, **config: Any) -> LlavaForConditionalGeneration:
    hf = build(**config)
    hf.save_pretrained(folder)
    write_tokenizer(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return hf


def write_tokenizer(folder: Path) -> None:
    """The word-level tokenizer with <image> and the Vicuna-style chat template."""
    vocab = {**SPECIALS, **{w: 3 + i for i, w in enumerate(WORDS)}}
    vocab.update({f"w{i}": i for i in range(3 + len(WORDS), IMAGE)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>", "<image>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": TEMPLATE,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
            }
        )
    )


def pictures(folder: Path) -> list[Path]:
    """A PNG and a JPEG of different shapes (neither square, so resize and crop both matter)."""
    rng = np.random.default_rng(1)
    png, jpg = folder / "p0.png", folder / "p1.jpg"
    Image.fromarray(rng.integers(0, 256, (40, 70, 3), dtype=np.uint8), "RGB").save(png)
    Image.fromarray(rng.integers(0, 256, (90, 61, 3), dtype=np.uint8), "RGB").save(jpg, quality=90)
    return [png, jpg]
