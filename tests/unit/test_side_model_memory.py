"""The side models' (--embedding-model, --rerank-model) share of the memory check: sized from their
tensor tables at float32, taken out of the free RAM a chat model may use, named in the refusal."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from localchat.errors import InsufficientMemoryError
from localchat.models.memory import MIB, MemoryEstimate, check_fits
from localchat.models.side_memory import SideModelMemory, side_model_memory

CHAT = MemoryEstimate(weights=300 * MIB, kv_cache=256 * MIB, overhead=400 * MIB)
EMBED = SideModelMemory("all-MiniLM-L6-v2", "embedding", resident=87 * MIB, file_backed=87 * MIB)


def _safetensors(folder: Path, tensors: dict[str, tuple[str, list[int]]]) -> Path:
    """A header-only-valid model.safetensors (the sizing reads only the header)."""
    folder.mkdir(parents=True, exist_ok=True)
    width = {"F32": 4, "F16": 2, "BF16": 2}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = width[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    (folder / "config.json").write_text('{"model_type": "bert"}')
    return folder


def test_a_chat_model_that_fits_alone_is_refused_beside_the_side_model() -> None:
    available = CHAT.total + 50 * MIB  # room for the chat model, not for it and the embedding model
    check_fits("chat", CHAT, available)  # no side model: it loads
    with pytest.raises(InsufficientMemoryError) as refused:
        check_fits("chat", CHAT, available, side=[EMBED])
    message = refused.value.message
    assert "the embedding model 'all-MiniLM-L6-v2' 0.08 GiB" in message
    assert "never unloaded" in message and "--embedding-model" in message
    assert "--rerank-model" not in message


def test_unloading_chat_models_still_counts_but_never_frees_the_side_model() -> None:
    available = CHAT.total - 100 * MIB
    check_fits("chat", CHAT, available, freeable=200 * MIB)  # evicting another chat model makes room
    with pytest.raises(InsufficientMemoryError, match="--rerank-model"):
        reranker = SideModelMemory("bge-reranker", "rerank", 150 * MIB, 150 * MIB)
        check_fits("chat", CHAT, available, freeable=200 * MIB, side=[reranker])


def test_copied_weights_are_already_out_of_the_free_ram() -> None:
    """A side model whose weights were converted at load (f16 -> f32, a GGUF dequantized) is anonymous
    memory the OS no longer reports as available: subtracting it again would refuse models that fit."""
    copied = SideModelMemory("qwen3-embedding", "embedding", resident=2000 * MIB, file_backed=0)
    check_fits("chat", CHAT, CHAT.total, side=[copied])


def test_sizes_come_from_the_tensor_table_at_float32(tmp_path: Path) -> None:
    f32 = _safetensors(tmp_path / "f32", {"emb": ("F32", [100, 8]), "norm": ("F32", [8])})
    f16 = _safetensors(tmp_path / "f16", {"emb": ("F16", [100, 8]), "norm": ("F32", [8])})
    mapped = side_model_memory("a", "embedding", f32)
    assert (mapped.resident, mapped.file_backed) == (808 * 4, 808 * 4)  # float32 stays a file mapping
    converted = side_model_memory("b", "rerank", f16)
    assert (converted.resident, converted.file_backed) == (808 * 4, 8 * 4)  # f16 is copied to float32
    assert converted.as_json() == {"id": "b", "type": "rerank", "resident_bytes": 808 * 4}
