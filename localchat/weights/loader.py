"""One entry point: a Hugging Face folder or a .gguf file in, a ModelBundle out."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from localchat.errors import ModelLoadError
from localchat.sampling_defaults import gguf_sampling_defaults
from localchat.vision.mmproj import pair_mmproj, paired_vision_config
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.hf_nvfp4 import NVFP4_METHODS, nvfp4_stream
from localchat.weights.hf_quant import dequantized_stream, quant_method
from localchat.weights.safetensors import (
    checkpoint_prefixes,
    config_from_folder,
    generation_defaults,
    iter_safetensors_weights,
    safetensors_files,
)
from localchat.weights.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# Tokens chat templates close a turn with; generation must stop there even when the file's EOS differs.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>", "<|eom_id|>")


def load_model(path: str | Path, name: str | None = None, mmproj: str | Path | None = None) -> ModelBundle:
    """Read config, tokenizer and chat template now; weights stay on disk until `iter_weights()`.
    `mmproj`: llama.cpp's vision projector for a GGUF (else the only mmproj*.gguf beside it is paired)."""
    source = Path(path).expanduser()
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise ModelLoadError(
                f"{source} is a folder without config.json. Expected a Hugging Face model folder "
                "(config.json, *.safetensors, tokenizer.json) or a .gguf file."
            )
        bundle = _load_folder(source, name or source.name)
    elif source.suffix.lower() == ".gguf":
        bundle = _load_gguf(source, name or source.stem)
        _pair_vision_projector(source, mmproj)
    elif not source.exists():
        raise ModelLoadError(
            f"{source} does not exist. Expected a Hugging Face model folder or a .gguf file."
        )
    else:
        raise ModelLoadError(
            f"{source} is neither a model folder nor a .gguf file. Expected a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer.json) or a .gguf file."
        )
    _stop_at_end_of_turn(bundle.config, bundle.tokenizer, bundle.chat_template)
    return bundle


def _load_folder(folder: Path, name: str) -> ModelBundle:
    config = config_from_folder(folder)
    prefixes = checkpoint_prefixes(folder)  # a multimodal wrapper's text LM: its names inside
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    method = quant_method(raw)  # GPTQ / AWQ / FP8: dequantized while streaming (hf_quant)
    qconfig = raw.get("quantization_config") or {}
    files = safetensors_files(folder, method is not None)  # parses every header now: a broken file fails
    defaults = generation_defaults(folder, config)
    tokenizer = Tokenizer.from_hf_folder(folder)
    return ModelBundle(
        name=name,
        path=folder,
        format="safetensors",
        config=config,
        iter_weights=lambda: (
            iter_safetensors_weights(files, prefixes)
            if method is None
            else nvfp4_stream(iter_safetensors_weights(files, prefixes), method)
            if method in NVFP4_METHODS
            else dequantized_stream(iter_safetensors_weights(files, prefixes), method, qconfig)
        ),
        tokenizer=tokenizer,
        chat_template=folder_chat_template(folder),
        generation_defaults=defaults,
    )


def _load_gguf(file: Path, name: str) -> ModelBundle:
    from localchat.weights.gguf import (
        check_gguf_tensors,
        config_from_gguf,
        gguf_chat_template,
        gguf_value,
        iter_gguf_weights,
        open_gguf,
    )

    reader = open_gguf(file)
    config = config_from_gguf(reader)
    check_gguf_tensors(reader)
    try:
        tokenizer = Tokenizer.from_gguf(reader)
    except ModelLoadError:
        raise
    except Exception as exc:  # the tokenizers library rejects an inconsistent vocabulary in its own words
        raise ModelLoadError(
            f"The tokenizer stored in {file} cannot be built ({exc}). The file may be damaged: "
            "download it again."
        ) from exc
    return ModelBundle(
        name=name,
        path=file,
        format="gguf",
        config=config,
        iter_weights=lambda: iter_gguf_weights(reader, config),
        tokenizer=tokenizer,
        chat_template=gguf_chat_template(reader),
        generation_defaults=gguf_sampling_defaults(lambda key: gguf_value(reader, key)),
    )


def _pair_vision_projector(file: Path, mmproj: str | Path | None) -> None:
    """Check the paired mmproj against the text model now, so a wrong one fails the load by name."""
    paired = pair_mmproj(file, mmproj)
    if paired is None:
        return
    if paired_vision_config(file) is None:
        log.info(
            "%s is beside %s, but its projector kind is not one localchat runs: text only", paired, file.name
        )
    else:
        log.info("vision projector %s paired with %s", paired, file.name)


def folder_chat_template(folder: Path) -> str | None:
    """tokenizer_config.json's chat_template (a string, or named templates: "default"), else
    chat_template.jinja, else chat_template.json (a multimodal processor's: Gemma 3, Mistral 3)."""
    for name in ("tokenizer_config.json", "chat_template.jinja", "chat_template.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            template = text if name.endswith(".jinja") else json.loads(text).get("chat_template")
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"Cannot read {path}: {exc}") from exc
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template:
            return template
    return None


def _stop_at_end_of_turn(config: ModelConfig, tokenizer: Tokenizer, template: str | None) -> None:
    """Treat the template's end-of-turn token as EOS too, and keep config and tokenizer in agreement."""
    for token in END_OF_TURN_TOKENS:
        if template and token in template:
            tokenizer.add_eos_token(token)
    config.eos_token_ids = list(dict.fromkeys([*config.eos_token_ids, *tokenizer.eos_token_ids]))
    tokenizer.eos_token_ids = list(config.eos_token_ids)
