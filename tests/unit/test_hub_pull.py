"""Pulling models from a fake Hugging Face hub on 127.0.0.1 (tests/helpers/fake_hub.py): the cache
layout, resume, checksums, disk space, gated repos, offline use, errors, list / rm / verify."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from localchat import hub
from localchat.errors import (
    ChecksumMismatchError,
    DownloadCancelledError,
    DownloadError,
    GatedRepoError,
    ModelNotOwnedError,
    NotEnoughDiskSpaceError,
    OfflineError,
    RepoNotFoundError,
    UnknownQuantError,
)
from localchat.hub import cache
from tests.helpers.fake_hub import TOKEN, FakeHub, Fault

Q4 = os.urandom(700_000)
Q8 = os.urandom(1_100_000)
REPO = "org/Model-GGUF"


@pytest.fixture
def repo(fake_hub: FakeHub):
    # no mmproj here: these tests count one model file (test_hub_mmproj.py pulls one with its projector)
    fake_hub.add_repo(REPO, {"model-Q4_K_M.gguf": Q4, "model-Q8_0.gguf": Q8, "README.md": b"# model\n"})
    return fake_hub


def cache_dir() -> Path:
    return Path(os.environ["HF_HUB_CACHE"])


def data_dir() -> Path:
    return Path(os.environ["LOCALCHAT_HOME"])


def test_pull_writes_the_hf_cache_layout_that_huggingface_hub_reads(repo: FakeHub, monkeypatch) -> None:
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    events: list[hub.PullProgress] = []
    model = hub.pull(REPO, progress=events.append)
    sha = hashlib.sha256(Q4).hexdigest()
    commit = repo.repos[REPO].commit
    assert model.name == f"{REPO}:Q4_K_M" and model.quant == "Q4_K_M" and model.source == "localchat"
    assert model.path == cache.snapshot_dir(cache_dir(), REPO, commit) / "model-Q4_K_M.gguf"
    assert model.path.is_symlink() and os.readlink(model.path) == f"../../blobs/{sha}"
    assert model.path.read_bytes() == Q4 and model.size_bytes == len(Q4) and model.complete
    assert (cache.repo_dir(cache_dir(), REPO) / "refs" / "main").read_text() == commit
    assert cache.lock_path(cache_dir(), REPO, sha).exists()
    assert not list((cache.repo_dir(cache_dir(), REPO) / "blobs").glob("*.incomplete"))
    found = try_to_load_from_cache(REPO, "model-Q4_K_M.gguf", cache_dir=cache_dir())
    assert found == str(model.path)
    scan = scan_cache_dir(cache_dir())  # what `hf cache` shows
    assert scan.warnings == [] and [(r.repo_id, r.size_on_disk) for r in scan.repos] == [(REPO, len(Q4))]
    # Phases in order, byte counts that end at the total.
    phases = [e.phase for e in events]
    assert phases[0] == "resolving" and phases[-1] == "done" and "downloading" in phases
    assert phases.index("verifying") < phases.index("done")
    assert events[-1].done_bytes == events[-1].total_bytes == len(Q4)
    assert events[-1].to_dict()["phase"] == "done"
    # The token went to the hub only, never to the file host.
    assert all(r.authorized for r in repo.requests("hub"))
    assert repo.requests("cdn") and not any(r.authorized for r in repo.requests("cdn"))
    # Only the asked-for quant came; a second pull is answered from disk without a single request.
    assert [r.path for r in repo.requests("cdn")] == [f"/lfs/{sha}"]
    repo.log.clear()
    assert hub.pull(REPO).path == model.path and repo.log == []


def test_repo_ids_are_stored_under_the_hubs_own_spelling(repo: FakeHub) -> None:
    model = hub.pull("ORG/model-gguf:q8_0")
    assert model.name == f"{REPO}:Q8_0" and model.repo_id == REPO
    assert model.path.is_relative_to(cache.repo_dir(cache_dir(), REPO))
    assert hub.find_local(f"{REPO}:Q8_0") == model


def test_a_dropped_connection_resumes_with_a_range_request(repo: FakeHub) -> None:
    repo.faults["model-Q4_K_M.gguf"] = Fault(drop_after=300_000)
    model = hub.pull(f"{REPO}:q4_k_m")
    assert model.path.read_bytes() == Q4
    starts = [r.range_start for r in repo.requests("cdn", "/lfs/")]
    assert starts == [None, 300_000]


def test_a_stalled_connection_is_retried(repo: FakeHub, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "0.5")
    repo.faults["model-Q4_K_M.gguf"] = Fault(drop_after=200_000, stall_s=3)
    assert hub.pull(REPO).path.read_bytes() == Q4
    assert [r.range_start for r in repo.requests("cdn", "/lfs/")] == [None, 200_000]


def test_server_errors_are_retried(repo: FakeHub) -> None:
    repo.faults["model-Q4_K_M.gguf"] = Fault(status=503, times=2)
    assert hub.pull(REPO).path.read_bytes() == Q4
    assert len(repo.requests("cdn", "/lfs/")) == 3


def test_a_corrupted_byte_is_an_error_and_nothing_is_kept(repo: FakeHub) -> None:
    repo.faults["model-Q4_K_M.gguf"] = Fault(corrupt_at=123_456)
    events: list[hub.PullProgress] = []
    with pytest.raises(ChecksumMismatchError, match="Nothing was kept") as info:
        hub.pull(REPO, progress=events.append)
    assert hashlib.sha256(Q4).hexdigest() in info.value.message
    assert events[-1].phase == "error" and "corrupted" in (events[-1].message or "")
    blobs = cache.repo_dir(cache_dir(), REPO) / "blobs"
    assert list(blobs.iterdir()) == []  # neither the file nor a partial
    assert hub.find_local(REPO) is None
    assert hub.list_local() == []  # not even a "partial download" entry


def test_a_catalog_pin_that_disagrees_with_the_file_is_refused(repo: FakeHub) -> None:
    (data_dir()).mkdir(parents=True, exist_ok=True)
    (data_dir() / "models.yaml").write_text(
        f"models:\n  pinned:\n    repo_id: {REPO}\n    file: model-Q4_K_M.gguf\n    sha256: {'ab' * 32}\n"
    )
    with pytest.raises(ChecksumMismatchError, match="ab" * 32):
        hub.pull("pinned")
    (data_dir() / "models.yaml").write_text(
        f"models:\n  pinned:\n    repo_id: {REPO}\n    file: model-Q4_K_M.gguf\n"
        f"    sha256: {hashlib.sha256(Q4).hexdigest()}\n"
    )
    model = hub.pull("pinned")
    assert model.name == "pinned" and model.path.read_bytes() == Q4
    assert hub.verify("pinned") == (True, f"pinned: 1 file(s), {len(Q4)} bytes, checksums match.")


def test_not_enough_disk_space_is_refused_before_the_first_byte(repo: FakeHub, monkeypatch) -> None:
    monkeypatch.setattr(cache, "free_bytes", lambda _folder: 500_000)
    with pytest.raises(NotEnoughDiskSpaceError) as info:
        hub.pull(REPO)
    message = info.value.message
    assert str(cache_dir()) in message and "HF_HOME" in message and "--home" in message
    assert "0.00 GB are free" in message or "GB are free" in message
    assert repo.requests("cdn") == []  # not one byte was fetched
    monkeypatch.setattr(cache, "free_bytes", lambda _folder: 800_000)
    assert hub.pull(REPO).complete


def test_a_gated_repo_says_what_to_do_and_works_with_a_token(fake_hub: FakeHub, monkeypatch) -> None:
    fake_hub.add_repo("meta/Gated-GGUF", {"gated-Q4_K_M.gguf": Q4}, gated=True)
    with pytest.raises(GatedRepoError) as info:
        hub.pull("meta/Gated-GGUF")
    message = info.value.message
    assert "accept its licence" in message and "HF_TOKEN" in message and "meta/Gated-GGUF" in message
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert hub.pull("meta/Gated-GGUF").path.read_bytes() == Q4
    assert not any(r.authorized for r in fake_hub.requests("cdn"))


def test_offline_answers_from_the_cache_with_zero_requests(repo: FakeHub, monkeypatch) -> None:
    pulled = hub.pull(REPO)
    repo.log.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.pull(REPO).path == pulled.path
    assert hub.pull(f"{REPO}:Q4_K_M").path == pulled.path
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE"):
        hub.pull(f"{REPO}:Q8_0")
    assert repo.log == []


def test_unknown_repo_unknown_quant_and_no_network_are_clear(repo: FakeHub, monkeypatch) -> None:
    with pytest.raises(RepoNotFoundError, match="org/Nope-GGUF was not found"):
        hub.pull("org/Nope-GGUF")
    with pytest.raises(UnknownQuantError, match=r"Q4_K_M \(0.00 GB\), Q8_0 \(0.00 GB\)"):
        hub.pull(f"{REPO}:Q2_K")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(DownloadError, match=r"refused the access token \(401\)\. Check HF_TOKEN"):
        hub.pull(REPO)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(OfflineError, match=r"Cannot reach http://127\.0\.0\.1:9"):
        hub.pull("org/Other-GGUF")


def test_cancel_keeps_the_partial_and_the_next_pull_resumes(repo: FakeHub) -> None:
    repo.faults["model-Q4_K_M.gguf"] = Fault(throttle_bps=2_000_000)
    cancel = threading.Event()

    def stop_midway(event: hub.PullProgress) -> None:
        if event.phase == "downloading" and event.done_bytes > 150_000:
            cancel.set()

    events: list[hub.PullProgress] = []
    with pytest.raises(DownloadCancelledError, match="kept"):
        hub.pull(REPO, progress=lambda e: (events.append(e), stop_midway(e)), cancel=cancel)
    assert events[-1].phase == "cancelled"
    partial = hub.list_local()
    assert [(m.name, m.complete) for m in partial] == [(f"{REPO}:Q4_K_M", False)]
    assert 150_000 < partial[0].partial_bytes < len(Q4) and partial[0].size_bytes == len(Q4)
    repo.faults.clear()
    repo.log.clear()
    events.clear()
    model = hub.pull(REPO, progress=events.append)
    assert model.path.read_bytes() == Q4
    assert repo.requests("cdn")[0].range_start == partial[0].partial_bytes
    assert "resuming" in [e.phase for e in events]


def test_a_partial_download_can_be_removed(repo: FakeHub) -> None:
    repo.faults["model-Q4_K_M.gguf"] = Fault(throttle_bps=2_000_000)
    cancel = threading.Event()
    with pytest.raises(DownloadCancelledError):
        hub.pull(REPO, progress=lambda e: e.done_bytes > 100_000 and cancel.set(), cancel=cancel)
    kept = hub.list_local()[0].partial_bytes
    assert hub.remove(f"{REPO}:Q4_K_M") == kept > 0
    assert hub.list_local() == [] and not list((cache.repo_dir(cache_dir(), REPO) / "blobs").iterdir())


def test_a_bare_repo_name_means_the_default_quant_unless_the_hub_is_unreachable(
    repo: FakeHub, monkeypatch
) -> None:
    q8 = hub.pull(f"{REPO}:Q8_0")
    assert hub.pull(REPO).quant == "Q4_K_M"  # online: Q8_0 on disk does not answer "the default"
    hub.remove(f"{REPO}:Q4_K_M")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the hub is unreachable now
    events: list[hub.PullProgress] = []
    assert hub.pull(REPO, progress=events.append).path == q8.path
    assert "unreachable" in (events[-1].message or "")


def test_split_gguf_fetches_every_part_side_by_side(fake_hub: FakeHub) -> None:
    parts = {f"big-Q4_K_M-0000{i}-of-00003.gguf": os.urandom(150_000 + i) for i in (1, 2, 3)}
    fake_hub.add_repo("org/Big-GGUF", {**parts, "big-Q8_0.gguf": b"x" * 20_000})
    fake_hub.faults.update({name: Fault(throttle_bps=1_000_000) for name in parts})
    model = hub.pull("org/Big-GGUF")
    assert fake_hub.max_parallel == 3
    assert [p.name for p in model.files] == sorted(parts)
    assert model.path.name == "big-Q4_K_M-00001-of-00003.gguf"
    assert model.size_bytes == sum(len(b) for b in parts.values())
    assert all(p.read_bytes() == parts[p.name] for p in model.files)


def test_one_bad_part_fails_the_split_pull_and_stops_the_others(fake_hub: FakeHub) -> None:
    parts = {f"big-Q4_K_M-0000{i}-of-00003.gguf": os.urandom(300_000) for i in (1, 2, 3)}
    fake_hub.add_repo("org/Big-GGUF", parts)
    fake_hub.faults.update({name: Fault(throttle_bps=300_000) for name in parts})
    fake_hub.faults["big-Q4_K_M-00002-of-00003.gguf"] = Fault(corrupt_at=10, throttle_bps=3_000_000)
    with pytest.raises(ChecksumMismatchError, match=r"big-Q4_K_M-00002-of-00003\.gguf"):
        hub.pull("org/Big-GGUF")
    assert hub.find_local("org/Big-GGUF") is None
    [partial] = hub.list_local()
    assert not partial.complete and 0 < partial.partial_bytes < 600_000  # the others stopped early
    fake_hub.faults.clear()
    fake_hub.log.clear()
    model = hub.pull("org/Big-GGUF")
    assert all(p.read_bytes() == parts[p.name] for p in model.files)
    starts = sorted(r.range_start or 0 for r in fake_hub.requests("cdn"))
    assert (
        len(starts) == 3 and starts[0] == 0 and starts[-1] > 0
    )  # the corrupted part anew, the others resumed


def test_a_safetensors_repo_brings_config_tokenizer_and_weights(fake_hub: FakeHub) -> None:
    files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}", "model.safetensors": os.urandom(30_000),
             "pytorch_model.bin": os.urandom(30_000), "README.md": b"hi"}  # fmt: skip
    fake_hub.add_repo("org/Folder", files)
    model = hub.pull("org/Folder")
    assert model.format == "safetensors" and model.name == "org/Folder" and model.path.is_dir()
    assert sorted(p.name for p in model.path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert hub.verify("org/Folder")[0]  # small files are checked by their git blob id, weights by sha256


def test_list_and_rm_of_one_quant(repo: FakeHub) -> None:
    q4 = hub.pull(REPO)
    q8 = hub.pull(f"{REPO}:Q8_0")
    assert [(m.name, m.quant, m.size_bytes) for m in hub.list_local()] == [
        (f"{REPO}:Q4_K_M", "Q4_K_M", len(Q4)),
        (f"{REPO}:Q8_0", "Q8_0", len(Q8)),
    ]
    assert hub.remove(f"{REPO}:Q8_0") == len(Q8)
    assert [m.name for m in hub.list_local()] == [f"{REPO}:Q4_K_M"]
    assert q4.path.read_bytes() == Q4 and not q8.path.exists()
    assert not cache.blob_path(cache_dir(), REPO, hashlib.sha256(Q8).hexdigest()).exists()
    assert hub.remove(REPO, whole_repo=True) == len(Q4)
    assert hub.list_local() == [] and not cache.repo_dir(cache_dir(), REPO).exists()


def _other_tools_copy(repo_id: str, name: str, data: bytes) -> Path:
    """A file another tool (huggingface_hub, llama.cpp) put in the shared cache."""
    sha = hashlib.sha256(data).hexdigest()
    blob = cache.blob_path(cache_dir(), repo_id, sha)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    cache.link_snapshot(cache_dir(), repo_id, "c" * 40, name, sha)
    cache.write_ref(cache_dir(), repo_id, None, "c" * 40)
    return cache.snapshot_dir(cache_dir(), repo_id, "c" * 40) / name


def test_models_from_other_tools_are_found_never_refetched_and_not_deleted(repo: FakeHub) -> None:
    theirs = _other_tools_copy(REPO, "model-Q4_K_M.gguf", Q4)
    listed = hub.list_local()
    assert [(m.name, m.source, m.path) for m in listed] == [(f"{REPO}:Q4_K_M", "hf-cache", theirs)]
    assert hub.pull(REPO).path == theirs and repo.log == []  # nothing stored twice
    with pytest.raises(ModelNotOwnedError, match="--force"):
        hub.remove(REPO)
    assert theirs.read_bytes() == Q4
    assert hub.remove(REPO, force=True) == len(Q4) and not theirs.exists()


def test_verify_notices_a_file_damaged_on_disk(repo: FakeHub) -> None:
    model = hub.pull(REPO)
    assert hub.verify(REPO)[0]
    blob = model.path.resolve()
    data = bytearray(blob.read_bytes())
    data[10] ^= 1
    blob.write_bytes(bytes(data))
    ok, message = hub.verify(REPO)
    assert not ok and "corrupted" in message and "model-Q4_K_M.gguf" in message
    assert hub.verify("org/Unknown-GGUF")[0] is False


def test_a_pulled_tiny_gguf_loads(fake_hub: FakeHub, tmp_path: Path) -> None:
    from localchat.weights.loader import load_model
    from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

    cfg = tiny_config("qwen2")
    made = write_tiny_gguf(tmp_path / "tiny-Q8_0.gguf", random_state_dict(cfg), cfg, qtype="Q8_0")
    fake_hub.add_repo("org/Tiny-GGUF", {"tiny-Q8_0.gguf": made})
    bundle = load_model(hub.pull("org/Tiny-GGUF").path)
    assert bundle.config.model_type == "qwen2" and bundle.config.hidden_size == 256


def test_a_half_pulled_sharded_model_never_looks_complete(fake_hub: FakeHub) -> None:
    shards = {f"model-0000{i}-of-00002.safetensors": os.urandom(40_000) for i in (1, 2)}
    fake_hub.add_repo("org/Sharded", {"config.json": b"{}", "tokenizer.json": b"{}", **shards})
    # The bad shard is slow (1 s), so the good one has finished when its failure stops the pull.
    fake_hub.faults["model-00002-of-00002.safetensors"] = Fault(corrupt_at=5, throttle_bps=40_000)
    with pytest.raises(ChecksumMismatchError):
        hub.pull("org/Sharded")
    assert hub.find_local("org/Sharded") is None
    [partial] = hub.list_local()
    assert (partial.name, partial.complete) == ("org/Sharded", False) and partial.partial_bytes >= 40_000
    fake_hub.faults.clear()
    fake_hub.log.clear()
    model = hub.pull("org/Sharded")
    assert sorted(p.name for p in model.path.iterdir()) == sorted(["config.json", "tokenizer.json", *shards])
    assert [r.path for r in fake_hub.requests("cdn")] == [
        f"/lfs/{hashlib.sha256(shards[sorted(shards)[1]]).hexdigest()}"
    ]
    # Another tool's snapshot with a shard missing is not a usable model either.
    (model.path / "model-00002-of-00002.safetensors").unlink()
    assert hub.find_local("org/Sharded") is None


def test_a_partial_of_a_file_the_repo_replaced_is_cleaned_up(repo: FakeHub) -> None:
    repo.faults["model-Q4_K_M.gguf"] = Fault(throttle_bps=2_000_000)
    cancel = threading.Event()
    with pytest.raises(DownloadCancelledError):
        hub.pull(REPO, progress=lambda e: e.done_bytes > 100_000 and cancel.set(), cancel=cancel)
    old_partial = cache.partial_path(cache_dir(), REPO, hashlib.sha256(Q4).hexdigest())
    assert old_partial.exists()
    new_q4 = os.urandom(300_000)
    repo.add_repo(REPO, {"model-Q4_K_M.gguf": new_q4})  # a new commit replaced the file
    assert hub.pull(REPO).path.read_bytes() == new_q4
    assert not old_partial.exists()
