"""Check a GGUF file's header against its size before gguf.GGUFReader parses it.

The reader trusts every count in the file: in a damaged header an array length of 2**63 makes it loop
(and grow lists) for ever, and a truncated download fails deep inside with a numpy reshape error. This
walk bounds each count by the bytes that are left and compares the size the tensor table promises with
the size on disk, so both become a ModelLoadError that says what is wrong and what to do.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from localchat.errors import ModelLoadError
from localchat.weights.lowbit import register_gguf_types

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# Fixed-size value types -> their size in bytes (the GGUF spec's numbering).
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_UINT32_TYPE = 4
register_gguf_types()  # Q2_0 and the other types an older gguf release lacks
_AGAIN = "Download it again (an interrupted or corrupted download leaves such a file)."


class _Damaged(Exception):
    """The header is inconsistent; the message says how."""


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes, order: str) -> None:
        self.data, self.order, self.offset, self.size = data, order, 0, len(data)

    def take(self, fmt: str) -> int:
        width = struct.calcsize(fmt)
        if self.offset + width > self.size:
            raise EOFError
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.offset)
        self.offset += width
        return int(value)

    def skip(self, num_bytes: int) -> None:
        if num_bytes > self.size - self.offset:
            raise EOFError
        self.offset += num_bytes

    def count(self, what: str, min_item_bytes: int) -> int:
        """A count read from the file, refused when its items could not fit in the bytes left."""
        value = self.take("Q")
        if value * min_item_bytes > self.size - self.offset:
            raise _Damaged(f"its header holds an impossible {what} ({value:,})")
        return value

    def string(self) -> bytes:
        length = self.count("string length", 1)
        start = self.offset
        self.skip(length)
        return bytes(self.data[start : self.offset])


def check_gguf_layout(path: Path) -> None:
    """Raise ModelLoadError unless `path` has a well-formed GGUF header whose tensors all lie inside the
    file. Reads only the header (a few MiB at most, for the tokenizer's vocabulary)."""
    size = path.stat().st_size
    if size < 24:
        raise ModelLoadError(f"{path} is not a GGUF file: it is only {size} bytes. {_AGAIN}")
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            raise ModelLoadError(f"{path} is not a GGUF file (it does not start with 'GGUF').")
        order = _byte_order(path, data)
        try:
            expected = _expected_size(_Cursor(data, order))
        except EOFError:
            raise ModelLoadError(
                f"{path} is incomplete or damaged: its header runs past the end of the file "
                f"({size:,} bytes). {_AGAIN}"
            ) from None
        except _Damaged as exc:
            raise ModelLoadError(f"{path} is damaged: {exc}. {_AGAIN}") from None
    if expected > size:
        raise ModelLoadError(
            f"{path} is incomplete or damaged: it is {size:,} bytes on disk, but its header describes "
            f"{expected:,} bytes ({_mib(expected - size)} missing). {_AGAIN}"
        )


def _byte_order(path: Path, data: mmap.mmap) -> str:
    (little,) = struct.unpack_from("<I", data, 4)
    if little in SUPPORTED_VERSIONS:
        return "<"
    (big,) = struct.unpack_from(">I", data, 4)
    if big in SUPPORTED_VERSIONS:
        return ">"
    raise ModelLoadError(
        f"{path} is GGUF version {little}, which this localchat cannot read (it reads versions 2 and 3)."
    )


def _expected_size(cur: _Cursor) -> int:
    """Walk the header; return the file size the tensor table implies."""
    cur.skip(4 + 4)  # magic and version, checked by the caller
    tensor_count = cur.take("Q")
    kv_count = cur.count("metadata count", 8 + 4 + 1)  # key length, value type, one byte of value
    if tensor_count * (8 + 4 + 4 + 8) > cur.size - cur.offset:  # name length, dims, type, offset
        raise _Damaged(f"its header holds an impossible tensor count ({tensor_count:,})")
    alignment = DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key = cur.string()
        value_type = cur.take("I")
        if key == b"general.alignment" and value_type == _UINT32_TYPE:
            alignment = cur.take("I")
            if alignment <= 0 or alignment & (alignment - 1):
                raise _Damaged(f"its alignment ({alignment}) is not a power of two")
        else:
            _skip_value(cur, value_type, depth=0)
    ends = [_tensor_end(cur) for _ in range(tensor_count)]
    if not ends:  # a vocabulary-only file ends with its header: no padding to an empty data section
        return cur.offset
    data_start = -(-cur.offset // alignment) * alignment
    return data_start + max(ends)


def _skip_value(cur: _Cursor, value_type: int, depth: int) -> None:
    if value_type in _SCALAR_SIZES:
        cur.skip(_SCALAR_SIZES[value_type])
    elif value_type == _STRING:
        cur.skip(cur.count("string length", 1))
    elif value_type == _ARRAY and depth < 2:
        item_type = cur.take("I")
        if item_type in _SCALAR_SIZES:  # fixed size: skip the whole array at once
            cur.skip(cur.count("array length", _SCALAR_SIZES[item_type]) * _SCALAR_SIZES[item_type])
            return
        if item_type == _STRING:
            _skip_strings(cur, cur.count("array length", 8))
            return
        for _ in range(cur.count("array length", 8)):  # strings and arrays take 8 bytes or more each
            _skip_value(cur, item_type, depth + 1)
    else:
        raise _Damaged(f"its header holds an unknown value type ({value_type})")


def _skip_strings(cur: _Cursor, count: int) -> None:
    # The vocabulary: ~100k strings in a real model, so this loop avoids per-item method calls.
    data, offset, size, unpack = cur.data, cur.offset, cur.size, struct.Struct(cur.order + "Q").unpack_from
    for _ in range(count):
        if offset + 8 > size:
            raise EOFError
        offset += 8 + unpack(data, offset)[0]
    if offset > size:
        raise EOFError
    cur.offset = offset


def _tensor_end(cur: _Cursor) -> int:
    """Read one tensor's entry; return where its data ends, relative to the start of the data section."""
    name = cur.string()
    num_dims = cur.take("I")
    if num_dims > MAX_DIMS:
        raise _Damaged(f"tensor {name[:80]!r} has {num_dims:,} dimensions (at most {MAX_DIMS})")
    num_elements = 1
    for _ in range(num_dims):
        num_elements *= cur.take("Q")  # Python ints: no overflow, however large
    raw_type = cur.take("I")
    offset = cur.take("Q")
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
    except (ValueError, KeyError):
        raise _Damaged(f"tensor {name[:80]!r} has an unknown type ({raw_type})") from None
    return offset + num_elements * type_size // block_size


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:,.1f} MiB" if num_bytes >= 2**20 else f"{num_bytes:,} bytes"
