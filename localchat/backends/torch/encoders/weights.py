"""Reading an encoder's tensors: model.safetensors (or pytorch_model.bin), with the task prefix
(`bert.`, `roberta.`, `model.`) that sequence-classification checkpoints put before the encoder."""

from __future__ import annotations

from pathlib import Path

import torch

from localchat.errors import ModelLoadError

_PREFIXES = ("bert.", "roberta.", "model.")


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelLoadError(f"{folder} holds no model.safetensors or pytorch_model.bin.")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        out[name] = tensor.to(torch.float32)
    return out
