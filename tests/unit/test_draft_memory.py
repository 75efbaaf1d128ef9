"""The RAM check before a load counts what speculative decoding loads beside the target: a draft model's
weights (sized as a target's), its KV floor and a hybrid draft's state rows (max_batch x k: live rows plus
snapshots, engine/draft_states.py), or an EAGLE-3 head's weights. Expected sizes are worked out from the
files written here and the documented floors, not from the code under test."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import NoReturn

import pytest

from localchat.engine.speculative import DEFAULT_MAX_BATCH
from localchat.errors import InsufficientMemoryError
from localchat.models.catalog import ResolvedModel
from localchat.models.manager import ModelManager
from localchat.models.memory import MIB, MIN_KV_BUDGET, check_fits, draft_bytes, estimate
from tests.helpers.fake_app import fake_settings

HYBRID = {  # Qwen3.5-shaped: 6 linear-attention layers of 8
    "model_type": "qwen3_5_text",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}
KV = 2  # --kv-cache-mib in these loads
# bf16 per sequence: conv state (q, k, v channels x (kernel - 1)) + the recurrent state (fp32), per layer
HYBRID_STATE = 6 * (3 * 96 * 2 + 4 * 16 * 8 * 4)


def _dense_folder(folder: Path, values: int) -> int:
    """A llama safetensors folder with one bf16 tensor of `values` values (zeros); returns the file's size."""
    folder.mkdir()
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "vocab_size": 256}
    config |= {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}
    (folder / "config.json").write_text(json.dumps(config))
    header = {
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [values], "data_offsets": [0, 2 * values]}
    }
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(2 * values))
    return sum(f.stat().st_size for f in folder.iterdir())


class Built(Exception):
    """The build step was reached: the memory check let the load through."""


def _build(*args: object, **kwargs: object) -> NoReturn:
    raise Built


def test_a_draft_model_adds_its_weights_and_kv_floor(tmp_path: Path) -> None:
    size = _dense_folder(tmp_path / "draft", 4096)
    assert draft_bytes(tmp_path / "draft", None) == size + MIN_KV_BUDGET
    assert draft_bytes(tmp_path / "draft", 64) == size + 64 * MIB  # its pool is at most --kv-cache-mib's
    assert draft_bytes(tmp_path / "draft", 1024) == size + MIN_KV_BUDGET
    assert draft_bytes(tmp_path / "draft", 64, state_rows=16) == size + 64 * MIB  # not hybrid: no rows
    assert draft_bytes(tmp_path / "draft", 0) == estimate(tmp_path / "draft", 0).weights  # sized as a target


def test_a_hybrid_draft_adds_its_state_rows(tmp_path: Path) -> None:
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.json").write_text(json.dumps(HYBRID))
    plain = draft_bytes(tmp_path / "h", 8)
    assert draft_bytes(tmp_path / "h", 8, state_rows=16) == plain + 16 * HYBRID_STATE
    settings = fake_settings(
        kv_cache_mib=KV, backend="torch", speculative="draft", draft_model=str(tmp_path / "h")
    )
    manager = ModelManager(settings, build=_build, available_memory=lambda: None, mcp=False)
    need = estimate(tmp_path / "h", settings.kv_cache_mib)
    rows = DEFAULT_MAX_BATCH * settings.num_speculative_tokens
    with_draft = manager._with_draft(need, ResolvedModel(tmp_path / "h", "h"), "bfloat16")
    assert with_draft.draft == plain - 8 * MIB + KV * MIB + rows * HYBRID_STATE


def test_a_pair_that_does_not_fit_together_is_refused_naming_the_draft(tmp_path: Path) -> None:
    _dense_folder(tmp_path / "target", 1 << 20)
    draft_size = _dense_folder(tmp_path / "draft", 1 << 19)
    plain = fake_settings(kv_cache_mib=KV, backend="torch")
    spec = fake_settings(
        kv_cache_mib=KV, backend="torch", speculative="draft", draft_model=str(tmp_path / "draft")
    )
    target = ResolvedModel(tmp_path / "target", "target")
    need = estimate(tmp_path / "target", plain.kv_cache_mib)
    draft = draft_bytes(tmp_path / "draft", spec.kv_cache_mib)
    assert draft == draft_size + KV * MIB
    room = need.total + draft // 2  # the target fits alone, not with its draft
    manager = ModelManager(spec, build=_build, available_memory=lambda: room, mcp=False)
    combined = manager._with_draft(need, target, "bfloat16")
    assert combined.total == need.total + draft and combined.target == need.total
    with pytest.raises(InsufficientMemoryError, match=r"target .* GiB.*\+ draft .* GiB.*--draft-model"):
        manager._load("target", target)
    with pytest.raises(Built):  # the same target without speculation loads
        ModelManager(plain, build=_build, available_memory=lambda: room, mcp=False)._load("target", target)
    check_fits("target", combined, available=need.total + draft)


def test_an_eagle_head_adds_its_weights_at_the_compute_dtype(tmp_path: Path) -> None:
    size = _dense_folder(tmp_path / "head", 4096)
    assert draft_bytes(tmp_path / "head", None, eagle=True) == size
    assert draft_bytes(tmp_path / "head", None, dtype="float32", eagle=True) == 2 * size
    settings = fake_settings(
        kv_cache_mib=KV, backend="torch", speculative="eagle", draft_model=str(tmp_path / "head")
    )
    manager = ModelManager(settings, build=_build, available_memory=lambda: None, mcp=False)
    need = estimate(tmp_path / "head", settings.kv_cache_mib)
    assert manager._with_draft(need, ResolvedModel(tmp_path / "head", "t"), "bfloat16").draft == size
