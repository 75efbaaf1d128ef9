"""AutoFP8 checkpoints (the older neuralmagic/*-FP8 repos) written as AutoFP8's `per_tensor_quantize` and
`save_quantized` write them: each layer linear e4m3 codes + a float32 scalar `weight_scale`, "static" a
scalar `input_scale` per linear, the KV-cache variant `output_scale` on k_proj / v_proj and older repos a
`kv_scale` per attention (tests/backends/test_hf_autofp8.py describes the format)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.backends.test_hf_fp8_compact import write_folder

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# What the compact runs (torch's kernels, MLX) load: no activation scales, and every scale a folder may carry
COMPACT_SCHEMES = ("dynamic", "static-kv")


def autofp8_parts(w: np.ndarray, static: bool) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """AutoFP8's per-tensor quantization: code = clamp(w x 448 / amax) as e4m3, `weight_scale` =
    amax / 448 (a 0-d float32), for "static" a calibrated 0-d `input_scale`."""
    t = torch.from_numpy(w)
    factor = FP8_MAX / t.abs().max().clamp(min=1e-12)
    codes = (t * factor).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    scale = factor.float().reciprocal()
    parts = {"weight": codes, "weight_scale": scale}
    if static:
        parts["input_scale"] = torch.tensor(0.0123, dtype=torch.float32)
    return parts, (codes.float() * scale).numpy()


def qconfig(scheme: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "quant_method": "fp8",
        "activation_scheme": scheme.removesuffix("-kv"),
        "ignored_layers": ["lm_head"],
    }
    if scheme.endswith("-kv"):
        config["kv_cache_scheme"] = "static"
    return config


def write_autofp8(tmp: Path, scheme: str) -> torch.nn.Module:
    """The tiny Llama of test_hf_fp8_compact in AutoFP8's layout; "static-kv" adds k_proj / v_proj
    `output_scale` (AutoFP8's KV variant), a per-attention `kv_scale` (vLLM-era repos) and a scale of a
    name no known writer uses."""
    hf = write_folder(tmp, lambda w: autofp8_parts(w, scheme != "dynamic"), qconfig(scheme))
    if scheme.endswith("-kv"):
        file = tmp / "model.safetensors"
        with safe_open(str(file), "pt") as handle:
            state = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        config: Any = hf.config
        for i in range(config.num_hidden_layers):
            attn = f"model.layers.{i}.self_attn"
            kv = (
                "k_proj.output_scale",
                "v_proj.output_scale",
                "kv_scale",
                "attn.v_cache_scale",
            )  # last: unknown
            for name in (f"{attn}.{n}" for n in kv):
                state[name] = torch.tensor(0.02, dtype=torch.float32)
        save_file(state, str(file))
    return hf
