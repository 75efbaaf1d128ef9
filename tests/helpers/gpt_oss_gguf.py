"""Tiny gpt-oss GGUF files written by llama.cpp's own converter (tests/helpers/llama_convert.py).

The converter names a BPE vocabulary's pre-tokenizer by hashing how it splits a fixed text, and refuses
vocabularies it does not know; a tiny byte-level one is not among them. `convert_gpt_oss` runs the
converter with that one lookup answering "gpt-2" (the split our tiny tokenizer does); every tensor and
metadata key is still the converter's own. The folder carries a harmony chat template, which the
converter copies into `tokenizer.chat_template`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from tests.helpers.llama_convert import ensure_converter

# The harmony markers gpt-oss's template and output use, as special tokens after the 256 byte tokens.
HARMONY_TOKENS = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
]
VOCAB_SIZE = 256 + 1 + len(HARMONY_TOKENS) + 1  # bytes, one merge, the markers, <|endoftext|>
# A short harmony template (the real one adds the system preamble and tool declarations).
HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}"
    "{% if m['role'] == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)

_RUN = """
import sys
sys.path.insert(0, {gguf_py!r})
sys.path.insert(0, {root!r})
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import runpy
sys.argv = [{script!r}, {folder!r}, "--outfile", {out!r}, "--outtype", {outtype!r}]
runpy.run_path({script!r}, run_name="__main__")
"""


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE vocabulary (one merge: a GGUF needs some) with the harmony markers as specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["Ġt"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([*HARMONY_TOKENS, "<|endoftext|>"])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|return|>",
        "chat_template": HARMONY_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def save_folder(model: torch.nn.Module, folder: Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """config.json + model.safetensors (`state`, default the model's own) + the tokenizer."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = state if state is not None else model.state_dict()
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"), {"format": "pt"}
    )
    hf_config: Any = model.config
    config = hf_config.to_dict() | {"architectures": ["GptOssForCausalLM"]}
    if state is not None and any(k.endswith("_blocks") for k in state):
        config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    write_tokenizer(folder)
    return folder


def convert_gpt_oss(folder: Path, out: Path, outtype: str = "f32") -> Path:
    root = ensure_converter()
    code = _RUN.format(
        gguf_py=str(root / "gguf-py"),
        root=str(root),
        script=str(root / "convert_hf_to_gguf.py"),
        folder=str(folder),
        out=str(out),
        outtype=outtype,
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
