"""Issue #34: GPTQ, AWQ and FP8 safetensors folders, written here from the format definitions, load through
localchat and match transformers running the same dequantized float32 weights (logits and greedy tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.errors import ModelLoadError
from localchat.weights.loader import load_model
from tests.helpers.parity import PROMPT, assert_close, hf_generate, hf_logits
from tests.helpers.quant_folders import Quantizer, hold_values, save_quantized_llama
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner, tiny_hf_model

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # output column held by nibble i of an AWQ GEMM word


def pack_nibbles(codes: np.ndarray, axis: int, order: list[int] | None = None) -> np.ndarray:
    """Eight 4-bit codes per int32 along `axis`, nibble i (bits 4i..4i+3) holding element order[i]."""
    order = order or list(range(8))
    c = np.moveaxis(codes.astype(np.uint32), axis, 0)
    c = c.reshape(c.shape[0] // 8, 8, *c.shape[1:])
    words = np.zeros((c.shape[0], *c.shape[2:]), dtype=np.uint32)
    for i, src in enumerate(order):
        words |= c[:, src] << np.uint32(4 * i)
    return np.moveaxis(words, 0, axis).view(np.int32)


def asym_quant(w_in_out: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, ...]:
    """Per (group, output) min/max 4-bit quantization of w [in, out]: codes, zeros, fp16 scales, values."""
    n_out = w_in_out.shape[1]
    scales = np.zeros((n_groups, n_out), np.float16)
    zeros = np.zeros((n_groups, n_out), np.int64)
    for g in range(n_groups):
        rows = w_in_out[groups == g]
        lo, hi = rows.min(0), rows.max(0)
        scales[g] = ((hi - lo) / 15).astype(np.float16)
        zeros[g] = np.clip(np.round(-lo / scales[g].astype(np.float32)), 0, 15)
    s = scales.astype(np.float32)[groups]
    codes = np.clip(np.round(w_in_out / s) + zeros[groups], 0, 15).astype(np.int64)
    values = (codes - zeros[groups]) * s
    return codes, zeros, scales, values


def gptq_parts(w: np.ndarray, group: int, act_order: bool) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    n_in = w.shape[1]
    perm = np.random.default_rng(n_in).permutation(n_in) if act_order else np.arange(n_in)
    g_idx = np.empty(n_in, np.int64)
    g_idx[perm] = np.arange(n_in) // group  # act-order: groups follow the permuted column order
    codes, zeros, scales, values = asym_quant(w.T, g_idx, n_in // group)
    parts = {
        "qweight": pack_nibbles(codes, axis=0),
        "qzeros": pack_nibbles(zeros - 1, axis=1),  # GPTQ v1 stores zero - 1
        "scales": scales,
        "g_idx": g_idx.astype(np.int32),
    }
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in parts.items()}, values.T


def awq_parts(w: np.ndarray, group: int) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    groups = np.arange(w.shape[1]) // group
    codes, zeros, scales, values = asym_quant(w.T, groups, w.shape[1] // group)
    parts = {
        "qweight": pack_nibbles(codes, axis=1, order=AWQ_ORDER),
        "qzeros": pack_nibbles(zeros, axis=1, order=AWQ_ORDER),
        "scales": scales,
    }
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in parts.items()}, values.T


def fp8_parts(w: np.ndarray, block: int | None) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    t = torch.from_numpy(w)
    if block is None:
        scale = t.abs().max() / 448
        full = scale.expand_as(t)
        scale_inv = scale.reshape(())
    else:
        blocks = t.reshape(t.shape[0] // block, block, t.shape[1] // block, block)
        scale_inv = blocks.abs().amax(dim=(1, 3)) / 448
        full = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)
    q = (t / full).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale_inv.float()}, (q.float() * full).numpy()


def ct_int_parts(w: np.ndarray, bits: int, group: int | None) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """compressed-tensors symmetric ints: 4-bit pack-quantized by group, or 8-bit int-quantized per channel."""
    top = 2 ** (bits - 1) - 1
    cols = w.reshape(w.shape[0], -1, group or w.shape[1])
    scale = (np.abs(cols).max(axis=2) / top).astype(np.float16)  # [out, in/group]
    q = np.clip(np.round(cols / scale.astype(np.float32)[..., None]), -top - 1, top).astype(np.int64)
    values = (q * scale.astype(np.float32)[..., None]).reshape(w.shape)
    q = q.reshape(w.shape)
    if bits == 8:
        parts = {"weight": q.astype(np.int8), "weight_scale": scale, "input_scale": np.ones(1, np.float32)}
    else:
        parts = {
            "weight_packed": pack_nibbles((q + 8).T, axis=0).T,  # along the input, offset to unsigned
            "weight_shape": np.array(w.shape, np.int64),
            "weight_scale": scale,
        }
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in parts.items()}, values


def ct_fp8_parts(w: np.ndarray) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    t = torch.from_numpy(w)
    scale = t.abs().amax(dim=1, keepdim=True) / 448  # per output channel
    q = (t / scale).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": scale.to(torch.bfloat16)}, (
        q.float() * scale.to(torch.bfloat16).float()
    ).numpy()


def ct_config(fmt: str, kind: str, bits: int, strategy: str, group: int | None = None) -> dict[str, Any]:
    weights = {"num_bits": bits, "type": kind, "symmetric": True, "strategy": strategy, "group_size": group}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ["lm_head"],
    }


def write_quantized(tmp: Path, quantizer: Quantizer, qconfig: dict[str, Any]) -> torch.nn.Module:
    """Quantize every layer linear of a tiny Llama into tmp; return the model holding the dequantized values."""
    hf = tiny_hf_model("llama")
    hold_values(hf, save_quantized_llama(tmp, hf, quantizer, qconfig))
    return hf


def gptq_case(group: int, act_order: bool) -> tuple[Quantizer, dict[str, Any]]:
    """A 4-bit GPTQ folder's quantizer and quantization_config (`desc_act`: act-order)."""
    config: dict[str, Any] = {"quant_method": "gptq", "bits": 4, "group_size": group}
    if act_order:
        config["desc_act"] = True
    return (lambda w: gptq_parts(w, group, act_order)), config


CASES: dict[str, tuple[Quantizer, dict[str, Any]]] = {
    "gptq-g32": gptq_case(32, False),
    "gptq-g64-act-order": gptq_case(64, True),
    "awq-g32": (
        lambda w: awq_parts(w, 32),
        {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"},
    ),
    "fp8-block32": (lambda w: fp8_parts(w, 32), {"quant_method": "fp8", "weight_block_size": [32, 32]}),
    "fp8-per-tensor": (lambda w: fp8_parts(w, None), {"quant_method": "fp8"}),
    "ct-w4a16-g32": (lambda w: ct_int_parts(w, 4, 32), ct_config("pack-quantized", "int", 4, "group", 32)),
    "ct-w8a8-int8": (lambda w: ct_int_parts(w, 8, None), ct_config("int-quantized", "int", 8, "channel")),
    "ct-fp8-channel": (ct_fp8_parts, ct_config("float-quantized", "float", 8, "channel")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_folder_matches_transformers_on_dequantized_weights(tmp_path: Path, case: str) -> None:
    quantizer, qconfig = CASES[case]
    hf = write_quantized(tmp_path, quantizer, qconfig)
    runner = fp32_runner(load_model(tmp_path))
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT))
    expected = hf_generate(hf, PROMPT, 6)
    got: list[int] = []
    for _ in range(6):
        got.append(int(logits[-1].argmax()))
        driver.feed("a", got[-1])
        _, logits = driver.step_logits()
    assert got == expected


def test_unknown_quant_method_is_refused(tmp_path: Path) -> None:
    write_quantized(tmp_path, lambda w: fp8_parts(w, None), {"quant_method": "bitsandbytes"})
    with pytest.raises(ModelLoadError, match="bitsandbytes"):
        load_model(tmp_path)


@pytest.mark.parametrize("case", ["gptq-g32", "awq-g32", "ct-w4a16-g32", "fp8-block32"])
def test_ram_check_sizes_quantized_folders_as_dequantized(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pre-load RAM check must count what the load makes (float32 here), not the 4x-8x smaller files.
    Without the kernels: with them int4 linears stay blocks (test_hf_quant_compact.py sizes those)."""
    from localchat.models.memory import estimate, path_size

    monkeypatch.setenv("LOCALCHAT_KERNELS", "off")

    quantizer, qconfig = CASES[case]
    hf = write_quantized(tmp_path, quantizer, qconfig)
    dense = sum(p.numel() * 4 for p in hf.state_dict().values())
    weights = estimate(tmp_path, kv_cache_mib=1, dtype="float32").weights
    assert path_size(tmp_path) < dense
    assert dense <= weights < dense * 1.05
