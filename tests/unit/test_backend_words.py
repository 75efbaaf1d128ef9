"""The About dialog names the backend in words ("PyTorch on CPU (AVX2)"), never a Python module."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from localchat.server.web.backend_words import backend_in_words


def runner(module: str, device_name: str, kernels: str | None = None) -> Any:
    cls = type("Runner", (), {"__module__": module})
    obj = cls()
    obj.device_name = device_name
    obj.quant = SimpleNamespace(kernels=SimpleNamespace(name=kernels) if kernels else None)
    return obj


def test_torch_cpu_with_localchat_kernels_names_the_isa() -> None:
    r = runner("localchat.backends.torch.runner", "cpu (bfloat16, GGUF blocks on ...)", "avx512vnni")
    assert backend_in_words(r, "auto") == "PyTorch on CPU (AVX-512 VNNI)"


def test_torch_cpu_without_kernels_asks_torch_for_its_isa() -> None:
    import torch

    words = backend_in_words(runner("localchat.backends.torch.runner", "cpu (bfloat16)"), "torch")
    expected = {"AVX512": " (AVX-512)", "AVX2": " (AVX2)"}.get(torch.backends.cpu.get_cpu_capability(), "")
    assert words in ("PyTorch on CPU" + expected, "PyTorch on CPU (NEON)", "PyTorch on CPU (SVE)")


def test_gpus_mlx_fake_and_no_model() -> None:
    cuda = runner("localchat.backends.torch.runner", "cuda:0 NVIDIA H200 (bfloat16, int4 linears)")
    assert backend_in_words(cuda, "auto") == "PyTorch on NVIDIA GPU (NVIDIA H200)"
    assert backend_in_words(runner("localchat.backends.mlx.runner", "mlx metal (bfloat16)"), "auto") == (
        "MLX on Apple GPU (Metal)"
    )
    fake = backend_in_words(runner("localchat.backends.fake", "fake"), "fake")
    assert fake == "the test backend (no model) on CPU" and "localchat." not in fake
    assert backend_in_words(None, "auto") == "picked when a model loads"
