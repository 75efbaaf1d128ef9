"""Damaged GGUF files: truncated downloads and mutated headers (random bytes, huge counts, wrong offsets).

Every case must end in a ModelLoadError (or load, when a mutation happens to be harmless), never in
another exception, a hang, or a large allocation: the reader trusts the counts it finds, so the loader
checks them against the file size first (localchat/weights/gguf_check.py).
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from gguf import GGUFReader

from localchat.errors import ModelLoadError
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

CASES_PER_KIND = 40
MAX_ALLOCATION = 64 * 2**20  # the file is ~1 MiB; a loader that believes a bad count allocates far more
HUGE = (2**64 - 1, 2**63, 2**40, 2**32 + 1, 0xFFFFFFFF)


@dataclass(frozen=True)
class Layout:
    """Where the counts sit in the pristine file, taken from gguf's own reader."""

    data: bytes
    header_end: int  # start of the tensor data
    count_offsets: list[int]  # uint64: tensor/kv counts, string and array lengths, dims
    tensor_offsets: list[int]  # uint64: each tensor's data offset


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    cfg = tiny_config("llama", num_hidden_layers=1, intermediate_size=256)
    path = write_tiny_gguf(tmp_path_factory.mktemp("fuzz") / "tiny.gguf", random_state_dict(cfg), cfg, "Q8_0")
    load_model(path)  # the pristine file loads
    reader = GGUFReader(path)
    counts, offsets = [16, 8], []  # GGUF.kv_count, GGUF.tensor_count
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        key_len = int(field.parts[0][0])
        counts.append(field.offset)  # the key's length
        value = field.offset + 8 + key_len + 4
        if len(field.parts) > 4 and field.types[0].name == "ARRAY":
            counts.append(value + 4)  # the array's length
            if field.types[-1].name == "STRING":
                counts.append(value + 12)  # its first string's length
        elif field.types[0].name == "STRING":
            counts.append(value)
    for tensor in reader.tensors:
        start = tensor.field.offset
        name_len = int(tensor.field.parts[0][0])
        n_dims = int(tensor.field.parts[2][0])
        counts.append(start)
        counts += [start + 8 + name_len + 4 + 8 * i for i in range(n_dims)]
        offsets.append(start + 8 + name_len + 4 + 8 * n_dims + 4)
    return Layout(path.read_bytes(), reader.tensors[0].data_offset, counts, offsets)


def _put_u64(data: bytearray, at: int, value: int) -> None:
    data[at : at + 8] = value.to_bytes(8, "little")


def _random_bytes(layout: Layout, rng: random.Random) -> bytes:
    data = bytearray(layout.data)
    for _ in range(rng.randint(1, 16)):
        data[rng.randrange(4, layout.header_end)] = rng.randrange(256)
    return bytes(data)


def _huge_count(layout: Layout, rng: random.Random) -> bytes:
    data = bytearray(layout.data)
    _put_u64(data, rng.choice(layout.count_offsets), rng.choice(HUGE))
    return bytes(data)


def _wrong_offset(layout: Layout, rng: random.Random) -> bytes:
    data = bytearray(layout.data)
    value = rng.choice([*HUGE, len(layout.data), rng.randrange(len(layout.data)), 1, 3])
    _put_u64(data, rng.choice(layout.tensor_offsets), value)
    return bytes(data)


def _truncated(layout: Layout, rng: random.Random) -> bytes:
    cut = rng.choice(
        [rng.randrange(0, layout.header_end), rng.randrange(layout.header_end, len(layout.data))]
    )
    return layout.data[:cut]


MUTATIONS: dict[str, Callable[[Layout, random.Random], bytes]] = {
    "random_bytes": _random_bytes,
    "huge_count": _huge_count,
    "wrong_offset": _wrong_offset,
    "truncated": _truncated,
}


def _load(path: Path) -> None:
    bundle = load_model(path)
    for weight in bundle.iter_weights():  # the tensor data too: a wrong offset shows up here
        assert weight.data.size >= 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_mutated_gguf_is_a_model_load_error(layout: Layout, kind: str, tmp_path: Path) -> None:
    rng = random.Random(f"gguf-{kind}")
    path = tmp_path / "damaged.gguf"
    outcomes: dict[str, int] = {}
    for case in range(CASES_PER_KIND):
        path.write_bytes(MUTATIONS[kind](layout, rng))
        tracemalloc.start()
        try:
            _load(path)
            outcome = "loaded"
        except ModelLoadError as exc:
            assert str(path) in exc.message or "GGUF" in exc.message, exc.message
            outcome = "ModelLoadError"
        except Exception as exc:  # anything else is the bug this test exists for
            raise AssertionError(f"{kind} case {case}: {type(exc).__name__}: {exc}") from exc
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < MAX_ALLOCATION, f"{kind} case {case} allocated {peak / 2**20:.0f} MiB"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("ModelLoadError", 0) >= CASES_PER_KIND // 4, outcomes  # the mutations do bite


def test_truncated_download_says_so_with_sizes(layout: Layout, tmp_path: Path) -> None:
    path = tmp_path / "partial.gguf"
    path.write_bytes(layout.data[: len(layout.data) - 1000])
    with pytest.raises(ModelLoadError) as err:
        load_model(path)
    message = err.value.message
    assert "incomplete or damaged" in message and "Download it again" in message
    assert (
        f"{len(layout.data) - 1000:,} bytes on disk" in message and f"{len(layout.data):,} bytes" in message
    )
