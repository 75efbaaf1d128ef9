"""The RAM held by the embedding and rerank models loaded beside the chat models (`--embedding-model`,
`--rerank-model`), so the model manager's memory check counts them. They are loaded once at startup
and never unloaded to make room for a chat model: the user asked for them by name."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.errors import ModelLoadError

_GIB = 2**30
_VALUE_BYTES = 4  # every encoder computes in float32 (backends/torch/encoders: weights read as float32)


@dataclass(frozen=True, slots=True)
class SideModelMemory:
    model_id: str
    kind: str  # "embedding" or "rerank"
    resident: int  # bytes of its weights once loaded (float32)
    # The part that stays a memory map of the file (float32 safetensors are not copied at load): the OS
    # counts those pages as reclaimable in MemAvailable, yet evicting them would re-read the file on
    # every request, so the check takes them out of the free RAM itself. The rest is already gone from it.
    file_backed: int

    def as_json(self) -> dict[str, object]:
        return {"id": self.model_id, "type": self.kind, "resident_bytes": self.resident}


def side_model_memory(model_id: str, kind: str, path: Path) -> SideModelMemory:
    """The float32 size of the encoder at `path` (a folder or a `.gguf` file), from its tensor table."""
    if path.is_file() and path.suffix == ".gguf":
        from localchat.weights.gguf import open_gguf

        try:
            values = sum(int(t.n_elements) for t in open_gguf(path).tensors)
        except (ModelLoadError, OSError, ValueError):
            values = path.stat().st_size // _VALUE_BYTES
        return SideModelMemory(model_id, kind, values * _VALUE_BYTES, 0)  # dequantized: a copy
    resident = file_backed = 0
    try:
        for info in _safetensors_header(path / "model.safetensors").values():
            nbytes = math.prod(int(d) for d in info["shape"]) * _VALUE_BYTES
            resident += nbytes
            file_backed += nbytes if info["dtype"] == "F32" else 0
    except (OSError, ValueError, KeyError, TypeError, struct.error):  # e.g. pytorch_model.bin: read whole
        resident = sum(f.stat().st_size for f in path.glob("*.bin") if f.is_file())
    return SideModelMemory(model_id, kind, resident, file_backed)


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The tensor table (encoders read one model.safetensors; any dtype: a BERT's int64 position_ids)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(min(length, 100 * 2**20)))
    header.pop("__metadata__", None)
    return dict(header)


def side_models_note(side: Sequence[SideModelMemory]) -> str:
    """The sentence the "does not fit" error adds: which side models hold how much, and what to do."""
    if not side:
        return ""
    held = ", ".join(f"the {m.kind} model {m.model_id!r} {m.resident / _GIB:.2f} GiB" for m in side)
    flags = " / ".join(
        dict.fromkeys("--embedding-model" if m.kind == "embedding" else "--rerank-model" for m in side)
    )
    return (
        f" Side models hold part of that RAM ({held}); they are never unloaded to make room for a chat "
        f"model: restart without {flags} (or with a smaller one) to free it."
    )
