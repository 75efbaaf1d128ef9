"""Embedding throughput and memory: all-MiniLM-L6-v2 (the real folder from tests/helpers/minilm.py)
through localchat's torch encoder and through the `sentence-transformers` package on the same folder,
in sentences per second at batch 1 and batch 64; then the resident memory of a real `localchat serve`
with SmolLM2-135M (chat) and MiniLM (--embedding-model) loaded together.

    python benchmarks/embed_bench.py [--seconds 5] [--threads N]

sentence-transformers is not a localchat dependency: `pip install sentence-transformers` to compare
(without it only localchat's rows are printed)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SENTENCES = [
    "A man is eating food.", "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome and everyone in the theatre clapped at the end of it.",
    "Two dogs play in the snow near a wooden fence.", "How do I reset my router password?",
    "Quarterly revenue grew by twelve percent, driven by strong subscription sales in Europe.",
    "The cat sleeps.", "Rotary position embeddings encode relative distance through complex phases.",
]  # fmt: skip


def _rate(run: Callable[[list[str]], object], batch: int, seconds: float) -> float:
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
    run(texts)  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run(texts)
        done += batch
    return done / (time.perf_counter() - start)


def _localchat(folder: Path) -> Callable[[list[str]], object]:
    from localchat.embeddings.model import load_embedding_model

    model = load_embedding_model(folder)
    return lambda texts: model.encoder.embed([model.encode_text(t) for t in texts])


def _sentence_transformers(folder: Path) -> Callable[[list[str]], object] | None:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    model = SentenceTransformer(str(folder), device="cpu")
    return lambda texts: model.encode(texts, batch_size=len(texts), normalize_embeddings=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    """VmRSS of `pid` and its descendants (a server may run its engine in a child process)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {pid}, True
    while grew:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    total = 0
    for p in tree:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:")), 0)
    return total / 1024


def _post(port: int, path: str, body: dict[str, object]) -> None:
    """POST, retried while the server answers 503 (the model is still loading)."""
    deadline = time.monotonic() + 300
    while True:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            urllib.request.urlopen(req, timeout=300).read()
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _served_rss(chat: Path, embedding: Path | None) -> float:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "localchat",
        "serve",
        "--f",
        str(chat),
        "--port",
        str(port),
        "--backend",
        "torch",
    ]
    if embedding is not None:
        cmd += ["--embedding-model", str(embedding)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("the server did not start")
        _post(
            port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        )
        if embedding is not None:  # one request each, so loads done on first use are counted
            _post(port, "/v1/embeddings", {"model": embedding.name, "input": ["warm up"]})
        return _rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per row")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-rss", action="store_true", help="skip the server memory rows")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    from tests.helpers.minilm import ensure_minilm

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = ensure_minilm()
    runners = {"localchat": _localchat(folder), "sentence-transformers": _sentence_transformers(folder)}
    print(f"all-MiniLM-L6-v2, CPU, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores")
    print(f"{'engine':<22} {'batch':>5} {'sentences/s':>12}")
    for name, run in runners.items():
        if run is None:
            print(f"{name:<22} (not installed)")
            continue
        for batch in (1, 64):
            print(f"{name:<22} {batch:>5} {_rate(run, batch, args.seconds):>12.1f}")
    if args.no_rss:
        return
    from localchat.models.default_model import ensure_default_model

    chat = ensure_default_model(REPO / ".models")
    print(f"\n{'localchat serve (torch, CPU)':<42} {'RSS MiB':>8}")
    print(f"{'SmolLM2-135M Q4_1 alone':<42} {_served_rss(chat, None):>8.0f}")
    print(f"{'SmolLM2-135M Q4_1 + all-MiniLM-L6-v2':<42} {_served_rss(chat, folder):>8.0f}")


if __name__ == "__main__":
    main()
