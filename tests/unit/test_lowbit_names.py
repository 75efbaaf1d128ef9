"""File names that state NVFP4, MXFP4, Q1_0 or Q2_0 are read as those quantizations wherever localchat
parses one (the hub's file picker and search, the RAM estimate's fallback when a tensor table is
unreadable), and the GGUF reader knows Q2_0, which gguf 0.19 lacks."""

from __future__ import annotations

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from localchat.hub.files import quant_of
from localchat.hub.search import _QUANT
from localchat.models.memory import _BITS, _quant_of
from localchat.weights.lowbit import LOWBIT_TYPES, register_gguf_types


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Bonsai-8B-Q1_0.gguf", "Q1_0"),
        ("Llama-3.2-1B-Instruct-Q2_0.gguf", "Q2_0"),
        ("Qwen3-4B-NVFP4.gguf", "NVFP4"),
        ("gpt-oss-20b-mxfp4.gguf", "MXFP4"),
        ("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ],
)
def test_quant_names_are_parsed(name: str, quant: str) -> None:
    assert (quant_of(name) or "").upper() == quant
    match = _QUANT.search(name)
    assert match is not None and match.group(1).upper() == quant
    stem = _quant_of(name)
    assert (stem is not None and stem in _BITS) or quant == "Q4_K_M"


def test_gguf_knows_every_lowbit_type() -> None:
    register_gguf_types()
    register_gguf_types()  # idempotent
    for name, (type_id, values, size) in LOWBIT_TYPES.items():
        member = GGMLQuantizationType(type_id)
        assert member.name == name and GGMLQuantizationType[name] is member
        assert GGML_QUANT_SIZES[member] == (values, size)
