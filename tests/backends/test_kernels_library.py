"""localchat/kernels/: the one binding of the C library, checked against csrc/lc_kernels.h and the library.

- Every function the header declares has a ctypes signature with as many arguments (and no other), so a
  C signature change that library.py misses fails here, not as a corrupted call at run time.
- The block table is gguf's (`GGML_QUANT_SIZES`), and the library sizes the x16 form from the same ids.
- A scratch buffer that cannot grow is `LC_ENOMEM`, which the Python side raises as InsufficientMemoryError.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from localchat.errors import BackendUnavailableError, InsufficientMemoryError
from localchat.kernels import blocks, library, step

HEADER = Path(__file__).resolve().parents[2] / "csrc" / "lc_kernels.h"
needs_library = pytest.mark.skipif(library.library() is None, reason="the kernels are not built")


def declared() -> dict[str, int]:
    """name -> number of parameters, for every LC_EXPORT declaration in the header."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    found = {}
    for name, params in re.findall(r"LC_EXPORT\s+\w+\s+(\w+)\s*\(([^)]*)\)\s*;", text):
        params = params.strip()
        found[name] = 0 if params in ("", "void") else params.count(",") + 1
    return found


def test_every_declared_export_has_a_signature_of_its_arity() -> None:
    found = declared()
    assert len(found) >= 15  # the parse found the header's declarations
    signatures = library.SIGNATURES | library.OPTIONAL  # OPTIONAL: bound where a build has them
    assert set(found) == set(signatures) and not set(library.SIGNATURES) & set(library.OPTIONAL)
    assert {name: len(args) for name, (args, _) in signatures.items()} == found
    assert found["lc_decode_layers"] == 1  # one lc_step_args by pointer


def test_the_block_table_is_ggufs() -> None:
    for name, block in blocks.BLOCKS.items():
        member = GGMLQuantizationType[name]
        assert block.type_id == int(member)
        assert (block.values, block.size) == GGML_QUANT_SIZES[member]
    assert set(blocks.BLOCKS) == blocks.X16_TYPES | blocks.IQ_TYPES | blocks.OTHER_TYPES
    assert (
        blocks.supports("Q4_K", 512) and not blocks.supports("Q4_K", 288) and not blocks.supports("F16", 64)
    )


def test_the_step_structs_have_the_headers_sizes() -> None:
    assert ctypes.sizeof(step.StepMatrix) == 120 and ctypes.sizeof(step.StepLayer) == 512
    assert ctypes.sizeof(step.StepArgs) == 224
    text = HEADER.read_text()
    assert "_Static_assert(sizeof(lc_step_matrix) == 120" in text
    assert "_Static_assert(sizeof(lc_step_args) == 224" in text
    assert f"#define LC_STEP_MAX_AUX {step.MAX_AUX} " in text


@needs_library
def test_the_library_was_built_with_the_bindings_step_args() -> None:
    """A build from older sources (26 positional arguments) would read garbage from one pointer: bind refuses it."""
    lib = library.library()
    assert lib is not None and lib.lc_step_args_bytes() == ctypes.sizeof(step.StepArgs)


@needs_library
def test_the_library_sizes_the_x16_form_of_every_x16_type() -> None:
    lib = library.library()
    assert lib is not None
    for name in blocks.X16_TYPES:
        block = blocks.BLOCKS[name]
        stored = 16 * (1024 // block.values) * block.size
        assert (
            lib.lc_x16_bytes(block.type_id, 16, 1024) >= stored
        )  # one whole panel: the stored bytes or more
    assert lib.lc_x16_bytes(blocks.BLOCKS["IQ4_XS"].type_id, 16, 1024) == -1  # read in place, never repacked


@needs_library
def test_a_buffer_that_cannot_grow_is_a_typed_memory_error() -> None:
    """2^44 activation rows need petabytes of scratch: malloc fails on any 64-bit machine, overcommit or not,
    and the library answers LC_ENOMEM before it reads anything."""
    lib = library.library()
    assert lib is not None
    q4 = blocks.BLOCKS["Q4_0"]
    args = library.segment_args([q4.type_id], [0], [1], [q4.size])
    rc = lib.lc_linear(0, None, 0, 1 << 44, 32, *args, 0, None, 0, 1, 1)
    assert rc == library.ENOMEM
    with pytest.raises(InsufficientMemoryError, match="out of memory"):
        library.check(rc, "unused")
    with pytest.raises(BackendUnavailableError, match="refused"):
        library.check(library.EINVAL, "refused")
    library.check(library.OK, "unused")


def test_binding_a_missing_build_fails_to_load(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        library.bind(str(tmp_path / "missing.so"))
