"""The 2026 families from GGUF files written by llama.cpp's own convert_hf_to_gguf.py (the llama-cpp-python
0.3.36 sdist, tests/helpers/llama_convert.py), so tensor names, metadata keys and the converter's tensor
rewrites are the real ones: SmolLM3 (`smollm3`), GLM-4.5 (`glm4moe`), Llama 4 text (`llama4`), Gemma 4
text (`gemma4`: per-layer kinds, head sizes and KV heads, KV sharing, per-layer embeddings, the MoE block)
and Mistral 4 (`mistral4`, converted from the Mistral Small 4 checkpoint as published).

Each tiny random model is saved as a transformers folder with a tiny tokenizer, converted, loaded through
`load_model` and run on the torch runner in float32: f32 files give transformers' prompt logits (fp32
tolerance) and its greedy tokens; q8_0 files stay within `Q8_0_LOGIT_BOUND` of them and keep the first
greedy tokens (`Q8_0_SAME_TOKENS`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

from localchat.weights.loader import load_model
from tests.helpers.llama_convert import ensure_converter
from tests.helpers.parity import GREEDY, PROMPT, assert_close, hf_generate, hf_logits
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import MINISTRAL3_ROPE, TINY_DEEPSEEK, fp32_runner, tiny_hf_model

pytestmark = pytest.mark.slow  # ~10 conversions by llama.cpp's script, a few seconds each

# 4 special tokens, 256 byte tokens, 4 merges: the vocabulary every tiny model here is built with.
VOCAB = 264
NEW_TOKENS = 8
# q8_0 rounds each weight to 1/127 of its block's largest. On these models (logits within +-5, std ~1.2)
# the prompt logits moved by 0.15 (GLM-4.5) to 0.37 (Gemma 4) and all 8 greedy tokens stayed the same;
# the test allows 0.5 and the first 6 tokens (a near tie may flip a later one on other hardware).
Q8_0_LOGIT_BOUND = 0.5
Q8_0_SAME_TOKENS = 6

# The converter names a BPE vocabulary's pre-tokenizer by hashing how it splits a fixed text and refuses
# vocabularies it does not know (a tiny one is not among them): this runs it with that one lookup
# answering "gpt-2", the split the tiny tokenizer does. Everything else is the converter's own.
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


def convert(folder: Path, out: Path, outtype: str) -> Path:
    root = ensure_converter()
    script = root / "convert_hf_to_gguf.py"
    code = _RUN.format(
        gguf_py=str(root / "gguf-py"),
        root=str(root),
        script=str(script),
        folder=str(folder),
        out=str(out),
        outtype=outtype,
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def byte_level_tokenizer(folder: Path, specials: list[str]) -> None:
    """GPT-2-style byte-level BPE (the gpt2 GGUF vocabulary): specials, 256 bytes, a few merges."""
    vocab = {token: i for i, token in enumerate(specials)}
    vocab |= {ch: len(specials) + i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    merges = [("Ġ", "t"), ("h", "e"), ("i", "n"), ("Ġ", "a")]
    vocab |= {a + b: len(vocab) + i for i, (a, b) in enumerate(merges)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    names = {"pad_token": specials[0], "bos_token": specials[1], "eos_token": specials[2]}
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **names})
    )


def byte_fallback_tokenizer(folder: Path) -> None:
    """SentencePiece-style BPE with byte fallback (what Gemma 4's converter reads): specials and the 256
    byte tokens."""
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials)}
    vocab |= {f"<0x{b:02X}>": len(specials) + b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    names = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **names})
    )


def _gemma4(**overrides: Any) -> torch.nn.Module:
    from tests.backends.test_gemma4 import tiny_gemma4

    return tiny_gemma4(**overrides, vocab_size=VOCAB)


def _gemma4_variant(name: str) -> Callable[[], torch.nn.Module]:
    from tests.backends.test_gemma4 import VARIANTS

    return lambda: _gemma4(**VARIANTS[name])


def _llama4() -> torch.nn.Module:
    from tests.backends.test_llama4 import VARIANTS

    # llama.cpp fixes the q temperature's floor (8192) and scale (0.1): transformers' defaults, kept here.
    overrides = {k: v for k, v in VARIANTS["llama4"].items() if k not in ("floor_scale", "attn_scale")}
    return tiny_hf_model("llama4_text", **overrides, vocab_size=VOCAB)


def _glm4_moe() -> torch.nn.Module:
    from tests.backends.test_glm4_moe import VARIANTS

    return tiny_hf_model("glm4_moe", **VARIANTS["glm4_moe"], vocab_size=VOCAB)


def _mistral_small_4() -> torch.nn.Module:
    """Mistral3ForConditionalGeneration around a mistral4 text model (the converter takes that class).
    The converter writes no q temperature: its onset (original_max_position_embeddings) lies past the
    tokens run here, where transformers' temperature is 1."""
    from transformers import (
        AutoModelForCausalLM,
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        Mistral4Config,
        Mistral4ForCausalLM,
    )

    AutoModelForCausalLM.register(Mistral4Config, Mistral4ForCausalLM, exist_ok=True)
    rope = {**MINISTRAL3_ROPE, "llama_4_scaling_beta": 0.5, "original_max_position_embeddings": 64}
    text: Any = tiny_hf_model(
        "mistral4", **TINY_DEEPSEEK, q_lora_rank=24, rope_parameters=rope, vocab_size=VOCAB
    )
    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    vision |= {"num_attention_heads": 2, "head_dim": 16, "image_size": 32, "patch_size": 16}
    torch.manual_seed(0)
    config = Mistral3Config(text_config=text.config.to_dict(), vision_config=vision, image_token_index=10)
    hf = Mistral3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            norm = name.endswith("norm.weight")
            param.copy_((1.0 if norm else 0.0) + (0.2 if norm else 0.15) * torch.randn_like(param))
    return hf.eval()


_PLAIN = ["<pad>", "<bos>", "<eos>", "<unk>"]
_GLM = ["<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>"]  # the tokens its converter looks up
# name -> (llama.cpp arch, model builder, tokenizer writer)
FAMILIES: dict[str, tuple[str, Callable[[], torch.nn.Module], Callable[[Path], None]]] = {
    "smollm3": (
        "smollm3",
        lambda: tiny_hf_model("smollm3", num_hidden_layers=4, vocab_size=VOCAB),
        lambda folder: byte_level_tokenizer(folder, _PLAIN),
    ),
    "glm4_moe": ("glm4moe", _glm4_moe, lambda folder: byte_level_tokenizer(folder, _GLM)),
    "llama4": ("llama4", _llama4, lambda folder: byte_level_tokenizer(folder, _PLAIN)),
    # Keys as values with one global KV head, the last two layers sharing KV, a twice-wide MLP there.
    "gemma4": ("gemma4", _gemma4_variant("gemma4-k-eq-v-shared"), byte_fallback_tokenizer),
    "gemma4-per-layer-embeddings": (
        "gemma4",
        _gemma4_variant("gemma4-per-layer-embeddings"),
        byte_fallback_tokenizer,
    ),
    "gemma4-moe": ("gemma4", _gemma4_variant("gemma4-moe"), byte_fallback_tokenizer),
    "mistral4": ("mistral4", _mistral_small_4, lambda folder: byte_level_tokenizer(folder, _PLAIN)),
}
QUANTIZED = ["smollm3", "glm4_moe", "llama4", "gemma4", "mistral4"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    """Built on first use: each family's model and its saved folder."""
    return {}


def _model_and_folder(
    name: str, folders: dict[str, tuple[torch.nn.Module, Path]], root: Path
) -> tuple[torch.nn.Module, Path]:
    if name not in folders:
        _, build, write_tokenizer = FAMILIES[name]
        hf: Any = build()
        folder = root / name
        hf.save_pretrained(folder)
        write_tokenizer(folder)
        folders[name] = hf, folder
    return folders[name]


def _gguf(folder: Path, outtype: str) -> Path:
    """The folder converted once per module run (the torch and MLX tests share the f32 file)."""
    out = folder.with_suffix(f".{outtype}.gguf")
    return out if out.is_file() else convert(folder, out, outtype)


def _run(path: Path, prompt: list[int]) -> tuple[torch.Tensor, list[int], str]:
    """Prompt logits and NEW_TOKENS greedy tokens from localchat's loader and torch runner (float32)."""
    bundle = load_model(path)
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(NEW_TOKENS - 1):
        driver.step()
    return logits.cpu(), driver.tokens("a")[len(prompt) :], bundle.config.model_type


@pytest.mark.parametrize("name", list(FAMILIES))
def test_f32_gguf_matches_transformers(
    name: str, folders: dict[str, tuple[torch.nn.Module, Path]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    hf, folder = _model_and_folder(name, folders, tmp_path_factory.mktemp("folders"))
    path = _gguf(folder, "f32")
    prompt = PROMPT * 2
    logits, tokens, model_type = _run(path, prompt)
    assert model_type == load_model(folder).config.model_type  # the same registry entry as the folder
    assert_close(logits, hf_logits(hf, prompt))
    assert tokens == hf_generate(hf, prompt, NEW_TOKENS)[:NEW_TOKENS]


@pytest.mark.parametrize("name", QUANTIZED)
def test_q8_0_gguf_stays_close(
    name: str, folders: dict[str, tuple[torch.nn.Module, Path]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    hf, folder = _model_and_folder(name, folders, tmp_path_factory.mktemp("folders"))
    path = _gguf(folder, "q8_0")
    bundle = load_model(path)
    assert any(w.dtype == "Q8_0" for w in bundle.iter_weights())
    prompt = PROMPT * 2
    logits, tokens, _ = _run(path, prompt)
    ref = hf_logits(hf, prompt)
    error = (logits - ref).abs().max().item()
    assert 0 < error < Q8_0_LOGIT_BOUND, error
    expected = hf_generate(hf, prompt, NEW_TOKENS)
    assert tokens[:Q8_0_SAME_TOKENS] == expected[:Q8_0_SAME_TOKENS]


def test_gguf_records_what_the_folder_says(tmp_path: Path) -> None:
    """Gemma 4's per-layer settings come back from the file's arrays and tensors, not from defaults."""
    _, folder = _model_and_folder("gemma4", {}, tmp_path)
    x = load_model(convert(folder, tmp_path / "g.gguf", "f32")).config.extra
    assert x["layer_head_dims"] == [16, 32, 16, 32] and x["layer_kv_heads"] == [2, 1, 2, 1]
    assert x["attention_k_eq_v"] and x["use_double_wide_mlp"] and x["num_kv_shared_layers"] == 2
    assert x["rope_parameters"]["full_attention"]["partial_rotary_factor"] == 0.25


@pytest.mark.mlx
@pytest.mark.parametrize("name", list(FAMILIES))
def test_mlx_runs_the_f32_gguf(
    name: str, folders: dict[str, tuple[torch.nn.Module, Path]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The MLX backend reads GGUF files through the same loader and names (its model files may rewrite
    the tensors their own way): prompt logits as transformers'."""
    pytest.importorskip("mlx.core")
    from localchat.backends import RunnerOptions
    from localchat.backends.mlx.runner import MLXRunner

    hf, folder = _model_and_folder(name, folders, tmp_path_factory.mktemp("folders"))
    path = _gguf(folder, "f32")
    runner = MLXRunner(load_model(path), RunnerOptions(device="cpu", dtype="float32", seed=0))
    driver = PagedDriver(runner)  # type: ignore[arg-type]
    prompt = PROMPT * 2
    driver.add("a", prompt)
    _, logits = driver.step_logits(every_token=True)
    assert_close(torch.from_numpy(np.array(logits)).float(), hf_logits(hf, prompt))


def test_gemma4_gguf_without_its_layer_kinds_is_a_load_error(tmp_path: Path) -> None:
    """A gemma4 file lacking the per-layer metadata is refused by name, not a TypeError mid-load."""
    from gguf import GGUFWriter

    from localchat.errors import ModelLoadError

    path = tmp_path / "damaged.gguf"
    writer = GGUFWriter(path, "gemma4")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_tensor("token_embd.weight", np.zeros((VOCAB, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="gemma4"):
        load_model(path)
