"""Tiny Gemma 2, Gemma 3 and windowed Mistral models through the Triton kernels (Triton's interpreter on
CPU tensors, as CUDA would run them) against transformers: sliding windows shorter than the prompt,
soft-capped scores and a non-default score scale, over chunked prefill, a cached prefix, ragged and
mixed prefill + decode steps."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton decorates the kernels

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.helpers.torch_batch import PagedDriver  # noqa: E402
from tests.helpers.torch_models import VARIANTS, bundle_from_hf, fp32_runner, tiny_hf_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter (set before import)"
)
ATOL = 1e-4
LONG = [(7 * i + 3) % 250 + 3 for i in range(45)]  # over five windows of 8
SHORT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]


@pytest.mark.parametrize("variant", ["gemma2", "gemma3", "mistral"])
def test_windowed_models_on_triton_match_transformers(monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    monkeypatch.setenv("LOCALCHAT_TORCH_ATTENTION", "triton")
    model_type, overrides = VARIANTS[variant]
    hf = tiny_hf_model(model_type, **overrides)
    runner = fp32_runner(bundle_from_hf(hf))
    assert runner.attention == "triton"  # no fallback to the PyTorch path for windows / soft-caps
    driver = PagedDriver(runner, block_size=4)
    driver.add("long", LONG)
    driver.add("short", SHORT)

    def check(schedule: dict[str, int] | None = None) -> None:
        ids, logits = driver.step_logits(schedule)
        for row, req_id in enumerate(ids):
            with torch.no_grad():
                ref = hf(torch.tensor([driver.tokens(req_id)])).logits[0, -1].float()
            assert (logits[row].cpu() - ref).abs().max().item() < ATOL, (variant, req_id)
            driver.feed(req_id, int(logits[row].argmax()))

    check({"long": 5, "short": len(SHORT)})  # a chunk of the long prompt beside a whole prompt
    check({"long": len(LONG) - 5, "short": 1})  # the rest (two tiles) over its cached 5, beside a decode
    for _ in range(3):  # decode rows whose windows slide across block boundaries
        check()
