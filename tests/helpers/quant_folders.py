"""Quantized Hugging Face folders for the GPTQ / AWQ / FP8 / compressed-tensors tests: a transformers
model saved with `save_pretrained`, then its weights replaced by one model.safetensors in which the
tensors a quantizer is named for are that quantizer's parts (`<module>.qweight`, `.weight_scale_inv`, ...),
and config.json given the format's `quantization_config`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from tests.helpers.parity import tiny_tokenizer_json

# w [out, in] float32 -> the checkpoint's parts of that linear, and the values they dequantize to
Quantizer = Callable[[np.ndarray], tuple[dict[str, torch.Tensor], np.ndarray]]


def quantize_tensors(
    named: Iterable[tuple[str, torch.Tensor]], pick: Callable[[str, torch.Tensor], Quantizer | None]
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """The checkpoint's tensors, each one `pick` gives a quantizer for replaced by its parts (named after
    its module), the others kept; and the quantized ones' exact (dequantized) values by name."""
    state: dict[str, torch.Tensor] = {}
    values: dict[str, np.ndarray] = {}
    for name, tensor in named:
        quantizer = pick(name, tensor)
        if quantizer is None:
            state[name] = tensor.clone().contiguous()
            continue
        parts, values[name] = quantizer(tensor.numpy())
        state.update({f"{name.removesuffix('.weight')}.{k}": v for k, v in parts.items()})
    return state, values


def save_quantized(
    folder: Path, state: dict[str, torch.Tensor], qconfig: dict[str, Any], tokenizer: str
) -> None:
    """`state` as the folder's only weights file, `qconfig` as its config's quantization_config, and the
    tokenizer.json text `tokenizer`."""
    for f in folder.glob("model*.safetensors"):
        f.unlink()
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = qconfig
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(tokenizer)


def hold_values(model: torch.nn.Module, values: dict[str, np.ndarray]) -> None:
    """Put the checkpoint's exact values into the transformers model (its reference run uses them)."""
    params = model.state_dict()
    with torch.no_grad():
        for name, value in values.items():
            params[name].copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))


def save_quantized_llama(
    folder: Path, hf: torch.nn.Module, quantizer: Quantizer, qconfig: dict[str, Any]
) -> dict[str, np.ndarray]:
    """A tiny Llama saved with every layer linear (`*_proj.weight`) quantized by `quantizer`, the rest as
    is; returns those linears' exact values by name."""
    hf.save_pretrained(folder)  # type: ignore[operator]

    def layer_linears(name: str, tensor: torch.Tensor) -> Quantizer | None:
        return quantizer if "layers." in name and name.endswith("_proj.weight") else None

    state, values = quantize_tensors(hf.state_dict().items(), layer_linears)
    save_quantized(folder, state, qconfig, tiny_tokenizer_json())
    return values
