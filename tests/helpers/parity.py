"""What the parity tests share (tests/backends/test_parity.py and the per-family modules that run its
tests on their own `pair`): the prompt, transformers as the reference, the tolerance and a driver that
hands back any backend's logits as numpy.

Tolerance: logits within 1e-4 absolute. Both sides compute in float32 with different kernels and
summation orders; measured differences are ~5e-6 on logits of magnitude ~10, so 1e-4 leaves 20x headroom
while a wrong weight, RoPE offset or mask moves logits by >1e-2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from localchat.backends import RunnerOptions
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.torch_batch import PagedDriver

ATOL = 1e-4
PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]
GREEDY = SamplingParams(temperature=0.0)


def mlx_runner(bundle: Any, dtype: str = "float32") -> Any:
    """The MLX runner on its CPU device (MLX is imported here, so torch-only machines never need it)."""
    from localchat.backends.mlx.runner import MLXRunner

    return MLXRunner(bundle, RunnerOptions(device="cpu", dtype=dtype, seed=0))


class Driver(PagedDriver):
    """The paged test driver for any backend's runner, with its logits handed back as float32 numpy."""

    def __init__(self, runner: Any, **options: Any) -> None:
        super().__init__(runner, **options)

    def step_logits(  # type: ignore[override]
        self, schedule: dict[str, int] | None = None, *, every_token: bool = False
    ) -> tuple[list[str], np.ndarray]:
        ids, logits = super().step_logits(schedule, every_token=every_token)
        return ids, as_numpy(logits)


def as_numpy(values: Any) -> np.ndarray:
    """float32 numpy from a torch tensor (on any device), an MLX array or numpy."""
    if isinstance(values, torch.Tensor):  # the torch runner may be on CUDA (LOCALCHAT_TEST_DEVICE)
        return values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


def hf_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab]: the reference logits at every position."""
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def hf_logits_np(hf: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    """`hf_logits` as numpy, for comparing with MLX's logits."""
    return hf_logits(hf, tokens).numpy()


def hf_generate(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, attention_mask=None)
    return out[0, len(prompt) :].tolist()


def assert_close(ours: Any, ref: Any) -> None:
    """Same shape and every logit within ATOL; either side a tensor (any device) or numpy."""
    ours, ref = as_numpy(ours), as_numpy(ref)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < ATOL


def tiny_tokenizer_json() -> str:
    """A word-level tokenizer.json over 256 ids, for tiny models saved as folders."""
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(256)}
    return Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str()
