"""Gemma 3 4B/12B/27B checkpoints (Gemma3ForConditionalGeneration): the gemma3_text LM nested in
`text_config` and under a name prefix loads alone on both backends, the vision tower and projector are
skipped, and its logits match the wrapper's on a text-only prompt. Three forms: as the installed
transformers saves it, with the hub files' sparse 4.5x `text_config` (only the keys that differ from
Gemma3TextConfig's defaults, `rope_scaling` instead of `rope_parameters`), and with transformers 5's
in-memory names (`model.language_model.*`). Also a Gemma 3 4B-style GGUF (arch `gemma3`, linear RoPE
scaling on the global layers only, vision left to a separate mmproj file), and the 27B GGUFs' score scale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig

from localchat.weights.loader import load_model
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

ATOL = 1e-4
PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64, 9, 12, 200, 31]  # longer than the 8-token window
# Six layers: Gemma 3's period (five sliding, then a global one), linear RoPE scaling as in 4B-27B.
# query_pre_attn_scalar and the RoPE bases stay at transformers' defaults (256 is not head_dim here).
TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 300,
    "sliding_window": 8,
    "max_position_embeddings": 512,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(
        Gemma3Config(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4)
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_((0.3 if name.endswith("norm.weight") else 0.15) * torch.randn_like(param))
    folder = tmp_path_factory.mktemp("gemma3")
    hf.eval().save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(300)}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    return hf, folder


def hub_config(folder: Path) -> None:
    """Rewrite config.json as the hub's Gemma 3 files have it (saved by transformers 4.50)."""
    raw = json.loads((folder / "config.json").read_text())
    defaults = Gemma3TextConfig().to_dict()
    text = raw["text_config"]
    sparse = {k: v for k, v in text.items() if k not in defaults or defaults[k] != v}
    sparse.pop("rope_parameters", None)
    sparse.pop("layer_types", None)  # 4.5x: the period of 6 (sliding_window_pattern) is the default
    sparse["rope_scaling"] = {"factor": 8.0, "rope_type": "linear"}
    sparse["model_type"] = "gemma3_text"
    assert "query_pre_attn_scalar" not in sparse and "rope_theta" not in sparse
    raw.update(text_config=sparse, eos_token_id=[1, 106], torch_dtype="bfloat16")
    raw.pop("tie_word_embeddings", None)
    (folder / "config.json").write_text(json.dumps(raw))


def in_memory_names(folder: Path) -> None:
    """Rename the tensors as transformers 5 names them in memory (`model.language_model.*`)."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    renamed = {_in_memory(name): t for name, t in tensors.items()}
    assert any(n.startswith("model.vision_tower.") for n in renamed)
    path.unlink()
    save_file(renamed, str(path), metadata={"format": "pt"})


def _in_memory(name: str) -> str:
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return "model." + name  # vision_tower.*, multi_modal_projector.*


def copy_of(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    target.mkdir()
    for file in folder.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


def reference(hf: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens])).logits[0].float().numpy()


def check_torch(hf: torch.nn.Module, folder: Path) -> None:
    bundle = load_model(folder)
    config = bundle.config
    assert config.model_type == "gemma3_text" and config.num_key_value_heads == 2
    assert config.extra["query_pre_attn_scalar"] == 256 and config.sliding_window == 8
    assert config.rope_scaling is not None and config.rope_scaling["factor"] == 8.0
    names = {w.name for w in bundle.iter_weights()}
    assert "model.layers.5.self_attn.q_norm.weight" in names
    assert not any("vision" in n or "projector" in n for n in names)
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits.cpu().numpy() - reference(hf, PROMPT)).max() < ATOL
    for _ in range(4):  # decode steps past the window, through the global layer's scaled RoPE
        driver.feed("a", int(logits[-1].argmax()))
        _, logits = driver.step_logits()
        assert np.abs(logits[0].cpu().numpy() - reference(hf, driver.tokens("a"))[-1]).max() < ATOL


def test_as_transformers_saves_it(saved: tuple[torch.nn.Module, Path]) -> None:
    hf, folder = saved
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gemma3"
    check_torch(hf, folder)


def test_hub_config_and_in_memory_names(saved: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    hf, folder = saved
    folder = copy_of(folder, tmp_path)
    hub_config(folder)
    in_memory_names(folder)
    check_torch(hf, folder)
    assert load_model(folder).config.eos_token_ids[:2] == [1, 106]


@pytest.mark.mlx
def test_mlx_loads_the_hub_layout(saved: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    from tests.helpers.parity import Driver, mlx_runner

    hf, folder = saved
    folder = copy_of(folder, tmp_path)
    hub_config(folder)
    driver = Driver(mlx_runner(load_model(folder)))
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - reference(hf, PROMPT)).max() < ATOL


def test_gemma3_4b_style_gguf_matches_transformers(tmp_path: Path) -> None:
    """llama.cpp converts the text LM of a Gemma 3 4B checkpoint to arch `gemma3` with linear RoPE
    scaling that applies to the global layers only."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
    from tests.helpers.torch_models import tiny_hf_model

    text = {k: v for k, v in TEXT.items() if k != "vocab_size"}
    hf = tiny_hf_model("gemma3_text", **{**text, "vocab_size": TINY_VOCAB_SIZE, "query_pre_attn_scalar": 16})
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype="F32", tokenizer_kind="gpt2")
    bundle = load_model(path)
    assert bundle.config.model_type == "gemma3_text"
    assert bundle.config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    driver = PagedDriver(fp32_runner(bundle))
    prompt = [t % TINY_VOCAB_SIZE for t in PROMPT]
    driver.add("a", prompt)
    _, logits = driver.step_logits(every_token=True)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float().numpy()
    assert np.abs(logits.cpu().numpy() - ref).max() < ATOL


@pytest.mark.parametrize(("model_type", "layers"), [("gemma3_text", 62), ("gemma2", 46)])
def test_27b_gguf_scales_scores_by_hidden_per_head(tmp_path: Path, model_type: str, layers: int) -> None:
    """GGUF records no query_pre_attn_scalar; llama.cpp recognises the 27B by its block count and
    scales by (hidden / heads) ** -0.5 there (Gemma 3 27B: 168, not its head_dim 128), as its
    checkpoint's query_pre_attn_scalar does. A tiny model with the 27B's depth and head_dim 8 != 64 / 4."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
    from tests.helpers.torch_models import tiny_hf_model

    sizes = {"hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2}
    hf = tiny_hf_model(
        model_type,
        **sizes,
        num_hidden_layers=layers,
        head_dim=8,
        query_pre_attn_scalar=16,
        vocab_size=TINY_VOCAB_SIZE,
        sliding_window=8,
        layer_types=None,
    )
    bundle = load_model(write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype="F32", tokenizer_kind="gpt2"))
    assert bundle.config.extra["query_pre_attn_scalar"] == 16
    driver = PagedDriver(fp32_runner(bundle))
    prompt = [t % TINY_VOCAB_SIZE for t in PROMPT]
    driver.add("a", prompt)
    _, logits = driver.step_logits(every_token=True)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float().numpy()
    # 62 layers of fp32 rounding drift past the 2-layer suites' 1e-4; head_dim's scale is off by ~9.
    assert np.abs(logits.cpu().numpy() - ref).max() < 1e-3
    assert (logits.cpu().numpy().argmax(-1) == ref.argmax(-1)).all()
