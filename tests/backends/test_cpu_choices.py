"""A load with every setting left to `auto` makes the choices cpu_features.py states for this CPU: the
compute dtype, the kernels' ISA, the x16 layout, and blocks or dense float32 matrices. test_other_cpus.py
reruns this file as other CPUs (LOCALCHAT_EMULATE_CPU), so each row of cpu_features.py's table is checked
through the real runner."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from localchat import cpu_features
from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")


def test_auto_load_makes_the_cpus_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (kernels.KERNELS_ENV, kernels.LAYOUT_ENV, quant.QUANT_ENV):
        monkeypatch.delenv(name, raising=False)
    flags = cpu_features.cpu_flags()
    if platform.machine() in ("x86_64", "AMD64") and cpu_features.host_flags():
        # the library's own CPU test (csrc/lc_kernels.c) and the flags agree, emulated or not
        assert kernels.runnable_isas() == cpu_features.runnable_isas(flags)
    isa = cpu_features.best_isa(kernels.runnable_isas())
    dtype = cpu_features.compute_dtype(flags)
    cfg = tiny_config()
    path = write_tiny_gguf(tmp_path / "tiny-Q4_K.gguf", random_state_dict(cfg), cfg, qtype="Q4_K")
    runner = TorchRunner(load_model(path), RunnerOptions(device="cpu", dtype="auto"))
    assert runner.dtype == getattr(torch, dtype)
    qkv = runner.model.layers[0].qkv
    if dtype == "float32" and isa not in quant.FAST_GEMM_ISAS:
        # portable C's many-row path is slow, and a float32 copy beside the blocks costs 4 bytes a value
        assert isinstance(qkv, torch.Tensor) and qkv.dtype == torch.float32
        return
    assert isinstance(qkv, BlockMatrix) and qkv.ops.name == isa
    packed = {bool(s.packed_rows) for s in qkv.segments}
    assert packed == {cpu_features.repacks(isa)}, (isa, packed)
