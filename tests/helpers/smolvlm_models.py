"""A tiny random SmolVLMForConditionalGeneration / Idefics3ForConditionalGeneration (transformers' own
classes: a Llama text model, the SigLIP-style tower and the pixel-shuffle connector) saved as a safetensors
folder with a word-level tokenizer holding the image marker tokens (<fake_token_around_image>,
<global-img>, <row_i_col_j>, <image>), a SmolVLM-style chat template and a preprocessor_config.json at the
tiny tower's size, for the SmolVLM parity and e2e tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    PreTrainedModel,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
)

IMAGE = 399
TILE, PATCH, SCALE = 32, 4, 2  # a 32 px tile: an 8 x 8 patch grid, pixel-shuffled to 4 x 4 = 16 tokens
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // SCALE**2
LONGEST_EDGE = 3 * TILE  # pictures are resized to this longest edge, then cut into tiles
TEXT: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
}
VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": TILE,
    "patch_size": PATCH,
}
ROW_COL = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
SPECIALS = [
    "<unk>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
    *ROW_COL,
]
WORDS = ["User:", "Assistant:", "what", "is", "in", "this", "picture", "?"]
# SmolVLM's hub template, trimmed: "User:" then the picture's <image> and the text, <end_of_utterance>.
TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}"
    "{% if m['content'] is string %}{{ ': ' + m['content'] }}{% else %}"
    "{% if m['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
    "{% elif p['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": TILE},
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": LONGEST_EDGE},
}


def build(kind: str = "smolvlm") -> PreTrainedModel:
    torch.manual_seed(0)
    if kind == "idefics3":
        vision = {**VISION, "model_type": "idefics3_vision"}
        hf: PreTrainedModel = Idefics3ForConditionalGeneration(
            Idefics3Config(text_config=TEXT, vision_config=vision, image_token_id=IMAGE, scale_factor=SCALE)
        )
    else:
        vision = {**VISION, "model_type": "smolvlm_vision"}
        hf = SmolVLMForConditionalGeneration(
            SmolVLMConfig(text_config=TEXT, vision_config=vision, image_token_id=IMAGE, scale_factor=SCALE)
        )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            scale = 0.3 if "norm" in name else 0.15
            param.copy_((1.0 if name.endswith("norm.weight") else 0.0) + scale * torch.randn_like(param))
    return hf.eval()


def vocab() -> dict[str, int]:
    out = {token: i for i, token in enumerate(SPECIALS)}
    out.update({w: len(SPECIALS) + i for i, w in enumerate(WORDS)})
    out.update({f"w{i}": i for i in range(len(out), IMAGE)})
    out["<image>"] = IMAGE
    return out


def write_folder(folder: Path, kind: str = "smolvlm") -> PreTrainedModel:
    hf = build(kind)
    hf.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel(vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([*SPECIALS, "<image>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": TEMPLATE,
                "bos_token": "<s>",
                "eos_token": "<end_of_utterance>",
                "unk_token": "<unk>",
            }
        )
    )
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return hf


def pictures(folder: Path) -> list[Path]:
    """A wide PNG (split into 2 x 3 tiles) and a tall JPEG (3 x 2), neither a multiple of the tile."""
    rng = np.random.default_rng(1)
    png, jpg = folder / "p0.png", folder / "p1.jpg"
    Image.fromarray(rng.integers(0, 256, (40, 70, 3), dtype=np.uint8), "RGB").save(png)
    Image.fromarray(rng.integers(0, 256, (90, 61, 3), dtype=np.uint8), "RGB").save(jpg, quality=90)
    return [png, jpg]
