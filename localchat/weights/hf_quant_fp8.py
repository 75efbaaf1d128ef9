"""FP8 checkpoints' tensor names (issue #34): which parts of a `quant_method: fp8` folder are a linear's
weight, its weight scale, or an activation / KV-cache scale that localchat does not use.

Two writers use `quant_method: fp8`. transformers' fine-grained FP8 (DeepSeek V3, Mistral, Qwen3 FP8) stores
`weight_scale_inv` per tensor or per 128 x 128 block; AutoFP8 (the older neuralmagic/*-FP8 repos, with
`activation_scheme` "static" or "dynamic") stores `weight_scale`, a float32 scalar per tensor. Despite the
names both are the same multiplier: value = e4m3 code x scale (AutoFP8 saves the reciprocal of its
quantizing factor 448 / amax; DeepSeek's `_inv` names the inverse of that factor too).

AutoFP8's static scheme adds each linear's `input_scale` (the calibrated amax / 448 of its activations, for
an fp8 x fp8 GEMM), its KV-cache variant an `output_scale` on k_proj / v_proj, and older repos a `kv_scale`
(or `k_scale` / `v_scale`) per attention. localchat computes activations and keeps its KV cache in
bf16 / fp16 / fp32, so these calibrate nothing here: they are dropped at load, counted in one log line.
"""

from __future__ import annotations

import logging
import re

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.hf_q8_blocks import E4M3FN, Q8Linear, dense_q8
from localchat.weights.tensors import WeightTensor

log = logging.getLogger(__name__)

# The weight's multiplier under either writer's name (see the docstring: the same meaning).
WEIGHT_SCALES = ("weight_scale_inv", "weight_scale")
# Activation and KV-cache scales (AutoFP8 static, its KV variant, vLLM-era `kv_scale` / `k_scale` /
# `v_scale`, AutoFP8's first `act_scale`): unused by a bf16 / fp32 engine.
ACTIVATION_SCALES = frozenset(
    {"input_scale", "act_scale", "output_scale", "kv_scale", "k_scale", "v_scale", "q_scale", "prob_scale"}
)
# Linear and attention modules whose other `*_scale` parts (another writer's activation / KV scales, e.g.
# vLLM's `self_attn.attn.k_scale` family) are dropped too: a model's own scalar parameters (Gemma 4's
# `layer_output_scale`, routers' scales) never sit on a linear or an attention module.
_SCALED_MODULES = ("proj", ".w1", ".w2", ".w3", "self_attn", ".attn")
# DeltaNet's beta / alpha rows, which Qwen's FP8 repos keep in bf16 (one row per value head: no 128-row
# block) while the qkv / z rows they are fused with at load are FP8.
DELTANET_GATES = re.compile(r".+\.layers\.\d+\.linear_attn\.in_proj_(b|a|ba)\.weight")


def fp8_part(module: str, part: str, dtype: str) -> str | None:
    """A `quant_method: fp8` tensor's role: "weight" (e4m3 codes), "scale" (the weight's multiplier),
    "ignored" (an activation / KV-cache scale), None for anything else (passed on as is)."""
    if part == "weight" and dtype == "F8_E4M3":
        return "weight"
    if part in WEIGHT_SCALES:
        return "scale"
    if part in ACTIVATION_SCALES or (part.endswith("_scale") and module.endswith(_SCALED_MODULES)):
        return "ignored"
    return None


def log_ignored(ignored: dict[str, int]) -> None:
    if ignored:
        log.info(
            "fp8 checkpoint: %s activation / KV-cache scales ignored (%s): localchat computes activations "
            "and keeps the KV cache in bf16 / fp16 / fp32, so static fp8 calibration has nothing to scale",
            sum(ignored.values()),
            ", ".join(f"{v} {k}" for k, v in sorted(ignored.items())),
        )


def dequantize_fp8(
    weight: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = (128, 128)
) -> np.ndarray:
    """fp8 bytes [out, in] times the weight's scale (`weight_scale_inv` or AutoFP8's `weight_scale`): a
    scalar or one value per `block` (config weight_block_size, DeepSeek's 128x128). Returns float32 [out, in]."""
    w = E4M3FN[np.asarray(weight, dtype=np.uint8)]
    s = np.asarray(scale_inv, dtype=np.float32)
    if s.size == 1:
        return w * s.reshape(())
    rows, cols = w.shape
    bo, bi = block
    if s.shape != (-(-rows // bo), -(-cols // bi)):
        raise ModelLoadError(f"FP8 scales {s.shape} do not tile a {rows}x{cols} weight in {bo}x{bi} blocks.")
    return w * np.repeat(np.repeat(s, bo, axis=0), bi, axis=1)[:rows, :cols]


def deltanet_gate(t: WeightTensor) -> Q8Linear | None:
    """A float in_proj_b / in_proj_a (Qwen3.5) or in_proj_ba (Qwen3-Next) of an FP8 / compressed-tensors
    folder as Q8_0 (`dense_q8`: exact values where a backend dequantizes), so the in_proj it joins stays
    in blocks; None for any other tensor. (GPTQ / AWQ folders keep them dense: beside act-order parts the
    torch loader fuses a dense in_proj, which should hold their exact values.)"""
    if t.dtype not in ("BF16", "F16", "F32") or len(t.shape) != 2 or not DELTANET_GATES.fullmatch(t.name):
        return None
    return dense_q8(t.name, t.dequantize())
