"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision towers from llama.cpp's mmproj GGUF, without torch: the pair's
config (shaped like the safetensors folder's config.json, so the prompt side and the towers in
backends/<lib>/vision/qwen_vl.py treat both alike) and the tensors as float32 arrays under the tower's
module names.

What llama.cpp's converter changes: the Conv3d patch embedding is split into its two temporal slices
(`v.patch_embd.weight` and `.weight.1`, stacked back here), Qwen2/2.5-VL's fused qkv is split into q, k
and v (concatenated back), the window size is not recorded (llama.cpp always uses 112 px) and the
full-attention layers are a period (`n_wa_pattern`). The pixel bounds are not recorded either: llama.cpp
allows 8 to 4096 image tokens unless the file says otherwise."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from gguf import quants

from localchat.errors import ModelLoadError
from localchat.vision.llava_mmproj import _values
from localchat.weights.gguf import open_gguf

# clip.projector_type -> the model type whose tower it is.
QWEN_VL_PROJECTORS = {
    "qwen2vl_merger": "qwen2_vl",
    "qwen2.5vl_merger": "qwen2_5_vl",
    "qwen3vl_merger": "qwen3_vl",
}
# clip.projector_type -> llama.cpp's name of the text architecture it feeds.
QWEN_VL_TEXT_ARCHS = {"qwen2vl_merger": "qwen2vl", "qwen2.5vl_merger": "qwen2vl", "qwen3vl_merger": "qwen3vl"}
# Qwen3.5 (and its MoE) publish Qwen3-VL's projector kind (the tower without DeepStack) for their hybrids.
QWEN3_5_TEXT_ARCHS = {"qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}
# More text architectures that Qwen3-VL's projector feeds, with the pair's model type.
QWEN3VL_MERGER_ARCHS = {**QWEN3_5_TEXT_ARCHS, "qwen3vlmoe": "qwen3_vl"}
WINDOW_PX = 112  # llama.cpp's fixed Qwen2.5-VL attention window (Qwen's own checkpoints use 112 too)
MIN_TOKENS, MAX_TOKENS = 8, 4096  # llama.cpp's bounds when the file records no pixel bounds

_FIXED = {
    "v.patch_embd.bias": "patch_embed.bias",
    "v.position_embd.weight": "pos_embed.weight",
}
_LAYER = {"attn_qkv": "attn.qkv", "attn_out": "attn.proj", "ln1": "norm1", "ln2": "norm2"}
# Each kind's block MLP and merger under the tower's names.
_MLP = {
    "qwen2_vl": {"ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"},
    "qwen2_5_vl": {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"},
    "qwen3_vl": {"ffn_up": "mlp.linear_fc1", "ffn_down": "mlp.linear_fc2"},
}
_MERGER = {
    "qwen2_vl": {"v.post_ln": "merger.ln_q", "mm.0": "merger.mlp.0", "mm.2": "merger.mlp.2"},
    "qwen3_vl": {"v.post_ln": "merger.norm", "mm.0": "merger.linear_fc1", "mm.2": "merger.linear_fc2"},
}
_MERGER["qwen2_5_vl"] = _MERGER["qwen2_vl"]
_TOWER_KINDS = {"qwen3_5": "qwen3_vl", "qwen3_5_moe": "qwen3_vl"}  # the pair's model type -> its tower's
_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")
_DEEPSTACK = re.compile(r"v\.deepstack\.(\d+)\.(norm|fc1|fc2)\.(weight|bias)")
_SPLIT_QKV = re.compile(r"v\.blk\.(\d+)\.attn_([qkv])\.(weight|bias)")


def pairs_with(kind: str, arch: str) -> bool:
    """Whether an mmproj of projector `kind` feeds a text GGUF of llama.cpp architecture `arch`."""
    return QWEN_VL_TEXT_ARCHS.get(kind) == arch or (kind == "qwen3vl_merger" and arch in QWEN3VL_MERGER_ARCHS)


def qwen_vl_config(
    meta: dict[str, Any], arch: str, hidden: int, image_token: int, mmproj: Path
) -> dict[str, Any]:
    """The config.json-shaped dict of the pair. `meta`: localchat.vision.mmproj's metadata of the file;
    `arch`: the text GGUF's architecture."""
    kind = QWEN_VL_PROJECTORS[str(meta["clip.projector_type"])]
    width = int(meta["clip.vision.embedding_length"])
    inner = int(meta["clip.vision.feed_forward_length"])
    depth = int(meta["clip.vision.block_count"])
    patch = int(meta["clip.vision.patch_size"])
    merge = int(meta["clip.vision.spatial_merge_size"] or 2)
    vision: dict[str, Any] = {
        "depth": depth,
        "num_heads": int(meta["clip.vision.attention.head_count"]),
        "patch_size": patch,
        "spatial_merge_size": merge,
        "temporal_patch_size": 2,  # the converter refuses any other
    }
    if kind == "qwen2_vl":  # its config names the tower's width embed_dim and the output's hidden_size
        vision |= {"embed_dim": width, "hidden_size": hidden, "mlp_ratio": inner // width}
    else:
        vision |= {"hidden_size": width, "intermediate_size": inner, "out_hidden_size": hidden}
    if kind == "qwen2_5_vl":
        period = int(meta["clip.vision.n_wa_pattern"] or depth)
        vision |= {
            "window_size": WINDOW_PX,
            "fullatt_block_indexes": [i for i in range(depth) if (i + 1) % period == 0],
        }
    if kind == "qwen3_vl":  # the converter derives image_size from the square position table
        side = int(meta["clip.vision.image_size"]) // patch
        deepstack = meta["clip.vision.is_deepstack_layers"] or []
        vision |= {
            "num_position_embeddings": side * side,
            "deepstack_visual_indexes": [i for i, on in enumerate(deepstack) if on],
        }
    token_px = (patch * merge) ** 2
    preprocessing: dict[str, Any] = {
        "min_pixels": int(meta["clip.vision.image_min_pixels"] or MIN_TOKENS * token_px),
        "max_pixels": int(meta["clip.vision.image_max_pixels"] or MAX_TOKENS * token_px),
    }
    for key, ours in (("image_mean", "mean"), ("image_std", "std")):
        if meta[f"clip.vision.{key}"]:
            preprocessing[ours] = tuple(float(v) for v in meta[f"clip.vision.{key}"])
    return {
        "model_type": QWEN3VL_MERGER_ARCHS.get(arch, kind),  # the tower is Qwen3-VL's either way
        "image_token_id": image_token,
        "text_config": {"hidden_size": hidden},
        "vision_config": vision,
        "preprocessing": preprocessing,
        "mmproj": str(mmproj),
    }


def read_qwen_vl_mmproj(config: dict[str, Any], mmproj: Path) -> dict[str, np.ndarray]:
    """The tower's state dict (QwenVisionTower's names, the patch embedding already flattened to the
    matmul's [width, C * T * P * P]) from the mmproj file. `config`: qwen_vl_config's dict."""
    kind = _TOWER_KINDS.get(str(config["model_type"]), str(config["model_type"]))
    deepstack = [int(i) for i in config["vision_config"].get("deepstack_visual_indexes", ())]
    state: dict[str, np.ndarray] = {}
    split: dict[tuple[str, str], dict[str, np.ndarray]] = {}  # (layer, weight|bias) -> q, k, v
    slices: dict[str, np.ndarray] = {}
    for tensor in open_gguf(mmproj).tensors:
        name = tensor.name
        if not name.startswith(("v.", "mm.")):
            continue
        values = _tensor_values(mmproj, tensor)
        if name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
            slices[name] = values  # [width, C, P, P] per temporal slice
        elif match := _SPLIT_QKV.fullmatch(name):
            split.setdefault((match[1], match[3]), {})[match[2]] = values
        elif (ours := _our_name(kind, name, deepstack)) is not None:
            state[ours] = values
    if len(slices) != 2:
        raise ModelLoadError(f"{mmproj.name} lacks the two temporal slices of the Qwen-VL patch embedding.")
    conv = np.stack([slices["v.patch_embd.weight"], slices["v.patch_embd.weight.1"]], axis=2)
    state["patch_embed.weight"] = conv.reshape(conv.shape[0], -1)  # [width, C, T, P, P] flattened
    for (layer, part), qkv in split.items():
        if set(qkv) != {"q", "k", "v"}:
            raise ModelLoadError(f"{mmproj.name} lacks part of layer {layer}'s attention ({sorted(qkv)}).")
        state[f"blocks.{layer}.attn.qkv.{part}"] = np.concatenate([qkv["q"], qkv["k"], qkv["v"]])
    return state


def _tensor_values(mmproj: Path, tensor: Any) -> np.ndarray:
    """float32 values of a tensor: f32/f16/bf16 as stored; the quantized types mmproj files are also
    published in (Q8_0, the k-quants) dequantized by the gguf package."""
    if tensor.tensor_type.name in ("F32", "F16", "BF16"):
        return _values(mmproj, tensor)
    try:
        values = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    except NotImplementedError as exc:
        raise ModelLoadError(
            f"{mmproj.name} stores {tensor.name} as {tensor.tensor_type.name}, which localchat cannot read. "
            "Download the mmproj's f16 file."
        ) from exc
    return np.asarray(values, dtype=np.float32).reshape([int(d) for d in reversed(tensor.shape)])


def _our_name(kind: str, name: str, deepstack: list[int]) -> str | None:
    if name in _FIXED:
        return _FIXED[name]
    stem, _, part = name.rpartition(".")
    if stem in _MERGER[kind]:
        return f"{_MERGER[kind][stem]}.{part}"
    if match := _BLOCK.fullmatch(name):
        layer, piece, part = match.groups()
        ours = _LAYER.get(piece) or _MLP[kind].get(piece)
        return None if ours is None else f"blocks.{layer}.{ours}.{part}"
    if (match := _DEEPSTACK.fullmatch(name)) and int(match[1]) in deepstack:
        piece = {"norm": "norm", "fc1": "linear_fc1", "fc2": "linear_fc2"}[match[2]]
        return f"deepstack_merger_list.{deepstack.index(int(match[1]))}.{piece}.{match[3]}"
    return None
