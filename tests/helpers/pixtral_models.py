"""A tiny random Mistral3ForConditionalGeneration (transformers' own class: a Mistral text model, the
Pixtral vision tower and Mistral 3's projector) saved as a safetensors folder with a word-level
tokenizer holding `[IMG]` / `[IMG_BREAK]` / `[IMG_END]`, a Mistral-style chat template that writes `[IMG]`
per picture, and Mistral Small 3.1's preprocessor and processor configs at the tiny tower's sizes, for
the Pixtral parity and e2e tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Mistral3Config, Mistral3ForConditionalGeneration

IMG, IMG_BREAK, IMG_END = 10, 12, 13
PATCH, MERGE, LONGEST_EDGE = 4, 2, 40
UNIT = PATCH * MERGE  # each resized side is a multiple of it
TEXT: dict[str, Any] = {
    "model_type": "mistral",
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "max_position_embeddings": 512,
    "rope_theta": 1_000_000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
}
VISION: dict[str, Any] = {
    "model_type": "pixtral",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "image_size": LONGEST_EDGE,
    "patch_size": PATCH,
    "hidden_act": "silu",
}
SPECIALS = {
    "<unk>": 0,
    "<s>": 1,
    "</s>": 2,
    "[INST]": 3,
    "[/INST]": 4,
    "[IMG]": IMG,
    "[IMG_BREAK]": IMG_BREAK,
}
SPECIALS["[IMG_END]"] = IMG_END
WORDS = ["what", "is", "in", "this", "picture", "?", "and"]
# Mistral's layout: [INST] user content [/INST]; an image part writes [IMG] where it stands.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST]"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}[IMG]{% else %} {{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    "[/INST]{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
PREPROCESSOR = {
    "image_processor_type": "PixtralImageProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "patch_size": {"height": PATCH, "width": PATCH},
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": LONGEST_EDGE},
}
PROCESSOR = {
    "image_break_token": "[IMG_BREAK]",
    "image_end_token": "[IMG_END]",
    "image_token": "[IMG]",
    "patch_size": PATCH,
    "processor_class": "PixtralProcessor",
    "spatial_merge_size": MERGE,
}


def build(text: dict[str, Any] | None = None, **config: Any) -> Mistral3ForConditionalGeneration:
    """`text`: another text config (Ministral 3's, Mistral 4's) in place of Mistral's."""
    torch.manual_seed(0)
    hf = Mistral3ForConditionalGeneration(
        Mistral3Config(
            text_config=text or TEXT,
            vision_config=VISION,
            image_token_index=IMG,
            spatial_merge_size=MERGE,
            tie_word_embeddings=False,
            **config,
        )
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            scale = 0.3 if "norm" in name else 0.15
            param.copy_((1.0 if name.endswith("norm.weight") else 0.0) + scale * torch.randn_like(param))
    return hf.eval()


def write_folder(
    folder: Path, text: dict[str, Any] | None = None, **config: Any
) -> Mistral3ForConditionalGeneration:
    hf = build(text, **config)
    hf.save_pretrained(folder)
    vocab = {**SPECIALS, **{w: 20 + i for i, w in enumerate(WORDS)}}
    vocab.update({f"w{i}": i for i in range(20 + len(WORDS), TEXT["vocab_size"])})
    vocab.update({f"x{i}": i for i in range(5, 20) if i not in SPECIALS.values()})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
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
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (folder / "processor_config.json").write_text(json.dumps(PROCESSOR))
    return hf


def pictures(folder: Path) -> list[Path]:
    """A wide PNG larger than the longest edge (shrunk) and a tall JPEG smaller than it (rounded up)."""
    rng = np.random.default_rng(1)
    png, jpg = folder / "p0.png", folder / "p1.jpg"
    Image.fromarray(rng.integers(0, 256, (45, 70, 3), dtype=np.uint8), "RGB").save(png)
    Image.fromarray(rng.integers(0, 256, (30, 13, 3), dtype=np.uint8), "RGB").save(jpg, quality=90)
    return [png, jpg]
