"""The torch backend's dense float32 run on the Q8_0 blocks an FP8 / int8 checkpoint is handed over as
(weights/hf_q8_blocks.py), for the FP8 tests that hold a compact run to it: the kernels and MLX hold those
blocks' values, not the checkpoint's exact ones, so against this run only summation order remains."""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat.backends.torch.runner import TorchRunner
from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.loader import load_model
from tests.backends.test_hf_fp8_compact import _block_values
from tests.helpers.torch_models import fp32_runner


def q8_values_runner(folder: Path) -> TorchRunner:
    """fp32_runner on `folder` with every Q8Linear dequantized to its Q8_0 blocks' values (the runner
    dequantizes at load, so the substitution is needed only while it is built)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Q8Linear, "dequantize", _block_values)
        return fp32_runner(load_model(folder))
