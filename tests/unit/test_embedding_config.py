"""Reading a sentence-transformers folder (pooling, Dense, Normalize, prompts) and the Matryoshka
truncation of `dimensions`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localchat.embeddings.st_config import read_sentence_config
from localchat.embeddings.vectors import truncate
from localchat.errors import InvalidRequestError, ModelLoadError


def _write(folder: Path, name: str, data: object) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data))


def _module(path: str, kind: str) -> dict[str, str]:
    return {"idx": "0", "name": path, "path": path, "type": f"sentence_transformers.models.{kind}"}


def test_full_sentence_transformers_folder(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "modules.json",
        [
            _module("", "Transformer"),
            _module("1_Pooling", "Pooling"),
            _module("2_Dense", "Dense"),
            _module("3_Normalize", "Normalize"),
        ],
    )
    _write(tmp_path, "1_Pooling/config.json", {"pooling_mode_lasttoken": True})
    _write(
        tmp_path,
        "2_Dense/config.json",
        {
            "in_features": 8,
            "out_features": 4,
            "bias": False,
            "activation_function": "torch.nn.modules.activation.Tanh",
        },
    )
    _write(tmp_path, "sentence_bert_config.json", {"max_seq_length": 128})
    _write(
        tmp_path,
        "config_sentence_transformers.json",
        {"prompts": {"query": "query: ", "document": "passage: "}, "default_prompt_name": "document"},
    )
    cfg = read_sentence_config(tmp_path)
    assert cfg.pooling == "lasttoken" and cfg.normalize and cfg.max_seq_length == 128
    assert [(d.in_features, d.out_features, d.bias, d.activation) for d in cfg.dense] == [
        (8, 4, False, "tanh")
    ]
    assert cfg.prompt(None) == "passage: " and cfg.prompt("query") == "query: "
    with pytest.raises(InvalidRequestError, match="no prompt named 'code'"):
        cfg.prompt("code")


@pytest.mark.parametrize(
    ("flags", "mode"),
    [({"pooling_mode_cls_token": True}, "cls"), ({"pooling_mode_mean_tokens": True}, "mean")],
)
def test_pooling_modes(tmp_path: Path, flags: dict[str, bool], mode: str) -> None:
    _write(tmp_path, "modules.json", [_module("1_Pooling", "Pooling")])
    _write(tmp_path, "1_Pooling/config.json", flags)
    cfg = read_sentence_config(tmp_path)
    assert cfg.pooling == mode and not cfg.normalize and cfg.prompt(None) == ""


def test_unsupported_pooling_and_plain_folder(tmp_path: Path) -> None:
    assert read_sentence_config(tmp_path, default_pooling="mean").pooling == "mean"  # no modules.json
    _write(tmp_path, "modules.json", [_module("1_Pooling", "Pooling")])
    _write(tmp_path, "1_Pooling/config.json", {"pooling_mode_max_tokens": True})
    with pytest.raises(ModelLoadError, match="unsupported pooling"):
        read_sentence_config(tmp_path)


def test_dimensions_truncate_and_renormalise() -> None:
    v = np.array([[3.0, 4.0, 12.0]], dtype=np.float32) / 13.0
    out = truncate(v, 2, 3)
    np.testing.assert_allclose(out, [[0.6, 0.8]], atol=1e-6)
    assert truncate(v, None, 3) is v and truncate(v, 3, 3) is v
    for bad in (4, 0):
        with pytest.raises(InvalidRequestError) as info:
            truncate(v, bad, 3)
        assert info.value.status == 400 and info.value.param == "dimensions"
