"""The pre-load RAM estimate (models/memory.py) against what the torch backend really holds, per compute
dtype and kernels' ISA: on this CPU here, and on the others through test_other_cpus.py, which reruns
this file with LOCALCHAT_EMULATE_CPU set (float32 compute on portable C or without the kernels expands
every matrix to 4 bytes a value: an estimate at bf16's 2 was half of it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat import cpu_features
from localchat.backends import RunnerOptions
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.runner import TorchRunner
from localchat.models.memory import compact_gguf_types, estimate
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf


def _held_bytes(runner: TorchRunner) -> int:
    """Every parameter and block matrix the loaded model holds. Not the bf16 copies portable C's block
    matrices get in `auto`: only where they fit in a share of the free RAM (quant.DENSE_COPY_RAM_FRACTION),
    so the estimate leaves them out as the load would when RAM is short."""
    total = 0
    for module in runner.model.modules():
        total += sum(p.nbytes for p in module._parameters.values() if p is not None)
        total += sum(v.nbytes for v in vars(module).values() if isinstance(v, BlockMatrix))
    return total


# (kernels, dtype): without the kernels bf16 compute holds torch's int4 and split-Q8 forms (sized by their
# own tests); float32 compute holds everything dense there
@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
@pytest.mark.parametrize(("choice", "dtype"), [("auto", "bfloat16"), ("auto", "float32"), ("off", "float32")])
def test_estimate_is_what_the_load_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, qtype: str, dtype: str, choice: str
) -> None:
    monkeypatch.setenv(kernels.KERNELS_ENV, choice)
    monkeypatch.delenv("LOCALCHAT_TORCH_QUANT", raising=False)
    monkeypatch.delenv("LOCALCHAT_KERNEL_LAYOUT", raising=False)
    cfg = tiny_config()
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", random_state_dict(cfg), cfg, qtype=qtype)
    runner = TorchRunner(load_model(path), RunnerOptions(device="cpu", dtype=dtype))
    held = _held_bytes(runner)
    norms = (2 * cfg["num_hidden_layers"] + 1) * cfg["hidden_size"]  # F32 in the file
    # bf16 compute holds the F32 norms in 2 bytes; the estimate counts them as stored (4)
    slack = 2 * norms if dtype == "bfloat16" else 0
    assert estimate(path, None, dtype=dtype).weights == held + slack
    isa = None if choice == "off" else cpu_features.best_isa(kernels.runnable_isas())
    blocks = any(isinstance(v, BlockMatrix) for m in runner.model.modules() for v in vars(m).values())
    assert blocks == (qtype in compact_gguf_types(dtype)), (isa, dtype)
    if dtype == "float32" and isa not in ("avx2", "avx512vnni", "neon"):
        assert held > 3 * path.stat().st_size // 2  # every matrix dense at 4 bytes a value
