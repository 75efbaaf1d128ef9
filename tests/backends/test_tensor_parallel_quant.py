"""Quantized shards on gloo with 2 CPU processes: a tiny GGUF Llama (Q8_0, Q4_0, and Q4_K, whose
256-value blocks the o_proj cut splits) is cut along its blocks as it loads; TP=2 gives TP=1's greedy
tokens, exactly (blocks dequantized per shard) and on localchat's CPU kernels (blocks kept)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from localchat.backends import RunnerOptions
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.parallel.group import close_group, init_group
from localchat.backends.torch.parallel.shard import sharded_runner
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.loader import load_model
from tests.backends.test_tensor_parallel import _run
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf
from tests.helpers.torch_models import exact_weights

OPTIONS = RunnerOptions(device="cpu", dtype="float32", num_threads=1)


def _runner(path: str, exact: bool, group: object = None) -> TorchRunner:
    bundle = load_model(path)
    if exact:
        with exact_weights():
            return TorchRunner(bundle, OPTIONS) if group is None else sharded_runner(bundle, OPTIONS, group)  # type: ignore[arg-type]
    return TorchRunner(bundle, OPTIONS) if group is None else sharded_runner(bundle, OPTIONS, group)  # type: ignore[arg-type]


def _worker(rank: int, world: int, init: str, path: str, exact: bool, out: str) -> None:
    torch.set_num_threads(1)
    group = init_group(rank, world, torch.device("cpu"), init_method=init)
    try:
        runner = _runner(path, exact, group)
        layer = runner.model.layers[0]
        if rank == 0:
            kinds = {name: type(getattr(layer, name)).__name__ for name in ("qkv", "o", "gate_up", "down")}
            shapes = {name: tuple(getattr(layer, name).shape) for name in ("qkv", "o", "gate_up", "down")}
            torch.save((_run(runner), kinds, shapes), out)
        else:
            _run(runner)
    finally:
        close_group()


@pytest.mark.parametrize("exact", [True, False], ids=["dequant", "kernels"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_quantized_shards_match_tp1(tmp_path: Path, qtype: str, exact: bool) -> None:
    torch.set_num_threads(1)
    cfg = tiny_config(vocab_size=512)
    path = str(write_tiny_gguf(tmp_path / "tiny.gguf", random_state_dict(cfg, seed=5), cfg, qtype=qtype))
    (expected_logits, expected_tokens) = _run(_runner(path, exact))
    out = tmp_path / "rank0.pt"
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(
        _worker, args=(2, init, path, exact, str(out)), nprocs=2, join=True, start_method="spawn"
    )
    (logits, tokens), kinds, shapes = torch.load(out, weights_only=False)
    assert tokens == expected_tokens
    # Rank 0 holds half of every matrix: 2 of 4 heads (+ 1 of 2 KV heads), half the MLP columns.
    assert shapes == {"qkv": (256, 256), "o": (256, 128), "gate_up": (512, 256), "down": (256, 256)}
    if exact:
        for ours, ref in zip(logits, expected_logits, strict=True):
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    else:
        # The kernels keep the file's blocks per shard; o_proj's Q4_K cut (128 of 256 values per block)
        # is dequantized per shard instead.
        assert kinds["qkv"] == kinds["gate_up"] == kinds["down"] == BlockMatrix.__name__
        assert kinds["o"] == ("Parameter" if qtype == "Q4_K" else BlockMatrix.__name__)
